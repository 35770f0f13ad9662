"""raytrain.runtime.worker.deepspeed_imports: DeepSpeed is imported without packages it only wants for unused features."""
import subprocess
import sys
import textwrap

import pytest

from raytrain.runtime.worker.deepspeed_imports import UNUSED_BY_DEEPSPEED, import_hiding


def test_a_hidden_package_looks_absent_to_the_import_and_is_importable_afterwards(tmp_path, monkeypatch):
    (tmp_path / "heavy_optional.py").write_text("LOADED = True\n")
    (tmp_path / "lib_under_test.py").write_text(textwrap.dedent("""
        try:
            import heavy_optional
            HAS = True
        except ImportError:
            HAS = False
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    lib = import_hiding("lib_under_test", ("heavy_optional",))
    try:
        assert lib.HAS is False
        assert "heavy_optional" not in sys.modules
        import heavy_optional  # the user's own code still gets it

        assert heavy_optional.LOADED
    finally:
        for name in ("lib_under_test", "heavy_optional"):
            sys.modules.pop(name, None)


def test_an_already_imported_package_is_not_hidden(tmp_path, monkeypatch):
    (tmp_path / "heavy_optional2.py").write_text("")
    (tmp_path / "lib_under_test2.py").write_text("import heavy_optional2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import heavy_optional2  # noqa: F401

    try:
        import_hiding("lib_under_test2", ("heavy_optional2",))  # would raise if it were hidden
        assert sys.modules["heavy_optional2"] is not None
    finally:
        for name in ("lib_under_test2", "heavy_optional2"):
            sys.modules.pop(name, None)


@pytest.fixture(scope="module")
def fresh_deepspeed_import() -> dict[str, str]:
    """One fresh interpreter (importing torch and DeepSpeed costs seconds) answers what a worker's import
    pulls in: after import_deepspeed, which unused packages are loaded; after importing DeepSpeed's Muon module
    (as ZeRO optimizers do), whether TorchInductor was loaded."""
    code = (
        "import sys, os; os.environ['DS_ACCELERATOR'] = 'cpu'\n"
        "from raytrain.runtime.worker.deepspeed_imports import import_deepspeed\n"
        "import_deepspeed()\n"
        "print('unused:', sorted(n for n in %r if n in sys.modules))\n"
        "import torch\n"
        "from deepspeed.runtime.zero.muon import muon_optimizer, original_muon\n"
        "print('inductor:', 'torch._inductor.compile_fx' in sys.modules)\n" % (UNUSED_BY_DEEPSPEED,)
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return dict(line.split(": ", 1) for line in out.stdout.splitlines() if line.startswith(("unused: ", "inductor: ")))


def test_deepspeed_on_a_worker_does_not_import_mlflow(fresh_deepspeed_import):
    """The real DeepSpeed, in a fresh interpreter: mlflow (installed with raytrain[track]) stays out."""
    assert fresh_deepspeed_import["unused"] == "[]"


def _run(code: str, **env) -> list[str]:
    prelude = (
        "import sys, os; os.environ['DS_ACCELERATOR'] = 'cpu'\n"
        "from raytrain.runtime.worker.deepspeed_imports import import_deepspeed\n"
        "import_deepspeed()\n"
        "import torch\n"
        "from deepspeed.runtime.zero.muon import muon_optimizer, original_muon\n"
    )
    proc = subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, **env})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()


def _deepspeed_before_0_19() -> bool:
    from importlib import metadata

    from raytrain.runtime.worker.deepspeed_compat import needs_fixes

    return needs_fixes(metadata.version("deepspeed"))


@pytest.mark.skipif(_deepspeed_before_0_19(), reason="DeepSpeed 0.18's own `import deepspeed` imports the Muon module "
                    "(and TorchInductor) before raytrain can make its decoration lazy: the saving needs 0.19")
def test_deepspeeds_muon_module_builds_no_compiled_wrappers_until_they_are_called(fresh_deepspeed_import):
    """ZeRO optimizers import DeepSpeed's Muon module; its torch.compile decorations (TorchInductor) wait for
    a call. Called (dynamo disabled there: no C++ compiler run in a unit test), they give the eager result."""
    assert fresh_deepspeed_import["inductor"] == "False"
    compare = (
        "g = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))\n"
        "out = original_muon.zeropower_via_newtonschulz5(g, 5)\n"
        "print(torch.equal(out, original_muon.zeropower_via_newtonschulz5.__wrapped__(g, 5)))\n"
    )
    assert _run(compare, TORCHDYNAMO_DISABLE="1")[-1] == "True"
