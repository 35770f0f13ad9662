"""The README's security model is stated, and the checkpoint loads that trust the storage are the known ones."""
import re

from tests.conftest import ROOT


def section(text, title):
    start = text.index(title)
    end = text.find("\n## ", start + len(title))
    return text[start:end if end > 0 else None]


def test_readme_states_who_can_reach_what():
    sec = section((ROOT / "README.md").read_text(), "\n## Security\n")
    for words in ("**On a laptop", "**On a shared machine.**", "**On Kubernetes (KubeRay).**",
                  "127.0.0.1", "auth_token", "NetworkPolicy", "resume trusts the storage"):
        assert words in sec, words
    k8s = section((ROOT / "k8s" / "README.md").read_text(), "## 5. What is exposed, and to whom")
    for words in ("6379", "8265", "10001", "raytrain-auth", "127.0.0.1", "runAsNonRoot"):
        assert words in k8s, words


def test_only_known_loads_trust_the_storage():
    """torch.load(weights_only=False) runs pickles: each one is named in the README's security section."""
    found = sorted(
        str(p.relative_to(ROOT)) for p in (ROOT / "raytrain").rglob("*.py")
        if re.search(r"torch\.load\([^)]*weights_only=False", p.read_text())
    )
    assert found == ["raytrain/runtime/checkpoint/files.py", "raytrain/runtime/export/consolidate.py"]  # consolidate: export
