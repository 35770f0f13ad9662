""".ci/run stops only what the suite recorded (no pkill by a name or port pattern) and runs its root-only
steps only as root: `.ci/run --stop-recorded FILE` for real, as root and as an unprivileged user."""
import json
import os
import shutil
import subprocess

import pytest

from tests.conftest import ROOT, needs

CI_RUN = ROOT / ".ci" / "run"


def test_no_pattern_kills_and_root_steps_are_guarded():
    text = CI_RUN.read_text()
    assert "pkill" not in text and "killall" not in text
    lines = text.splitlines()
    for i, line in enumerate(lines):
        code = line.split("#")[0]
        if ("ip netns" in code or "ip link" in code) and "echo" not in code:
            branch = "\n".join(lines[max(0, i - 4):i])
            assert "is_root || continue" in branch, f".ci/run:{i + 1} runs `ip` without the root guard: {line}"
    assert '\nCI=true .venv/bin/python -m pytest -n 2 ' in text and '"$rc" -eq 5' in text


def _stop_recorded(records, as_user=None):
    cmd = ["bash", str(CI_RUN), "--stop-recorded", str(records)]
    if as_user:
        cmd = ["setpriv", f"--reuid={as_user}", "--regid=nogroup", "--clear-groups", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd="/")


def _netns_exists(name):
    return any(l.split()[0] == name for l in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                            text=True).stdout.splitlines() if l.strip())


def test_a_recorded_netns_is_removed_by_root_and_left_alone_otherwise(tmp_path):
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("setpriv"):
        pytest.skip(needs("root", "creating a network namespace needs root (and `ip`, `setpriv`)"))
    name = f"rt-ci-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(needs("network namespaces", f"`ip netns add` failed: {made.stderr.strip()}"))
    try:
        records = tmp_path / "clusters.jsonl"
        records.write_text(json.dumps({"what": "multinode-node2", "home": str(tmp_path / "gone"), "netns": name}) + "\n")
        records.chmod(0o644)
        tmp_path.chmod(0o755)
        as_user = _stop_recorded(records, as_user="nobody")
        assert as_user.returncode == 0, as_user.stderr
        assert _netns_exists(name)  # not root: not touched (and no error)
        as_root = _stop_recorded(records)
        assert as_root.returncode == 0, as_root.stderr
        assert not _netns_exists(name)
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def test_nothing_recorded_nothing_stopped(tmp_path):
    proc = _stop_recorded(tmp_path / "none.jsonl")
    assert proc.returncode == 0 and proc.stderr == ""
