"""docs/security.md, the security reference, says what each protection of issue 40 covers and names what the
code names (the reserved variables, the redaction module), so that the two cannot drift apart unnoticed."""
from raytrain.config.options import USER_ENV_SWITCHES
from tests.conftest import ROOT


def test_the_security_reference_covers_each_protection():
    text = (ROOT / "docs" / "security.md").read_text()
    for words in ("## Who is trusted", "## On a shared machine", "## On Kubernetes (KubeRay)", "k8s/README.md",
                  "## What a submit ships", "creds -> .aws", "`git ls-files`", "raytrain/redact.py",
                  "--track-args", "X-Amz-Signature", "0700", "0600", "`trackers.json` is not trusted",
                  "Resume trusts the storage", "RAYTRAIN_JOB_CODE", "--format hf --force", "## Not protected"):
        assert words in text, words
    settings_page = (ROOT / "docs" / "settings.md").read_text()
    for name in USER_ENV_SWITCHES:  # every variable --env accepts is documented as a job's setting
        assert f"| `{name}` |" in settings_page and "job_settings()" in text, name
