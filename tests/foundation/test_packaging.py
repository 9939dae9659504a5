"""`pip install .` and `pip install -e .` both give one top-level name, `tracelab`, with
tracelab.collectors and tracelab.app inside it and no top-level `collectors` or `app`."""

from __future__ import annotations

import os
import subprocess
import sysconfig
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROBE = """
import importlib.util, json, tracelab, tracelab.collectors, tracelab.app
print(json.dumps({
    "tracelab": tracelab.__file__,
    "collectors": tracelab.collectors.__file__,
    "app": tracelab.app.__file__,
    "top_collectors": importlib.util.find_spec("collectors") is not None,
    "top_app": importlib.util.find_spec("app") is not None,
}))
"""


@pytest.mark.parametrize("editable", [False, True], ids=["install", "editable"])
def test_install_modes(editable: bool, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=False, with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    # Borrow pip, setuptools and the dependencies from the environment running the tests (the
    # interpreter's own site-packages may lack `wheel`), without its editable tracelab: a plain
    # path entry does not run that folder's .pth finders.
    site = next(env_dir.glob("lib/python*/site-packages"))
    (site / "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    cmd = [str(py), "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-q"]
    cmd += ["-e", str(REPO)] if editable else [str(REPO)]
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    out = subprocess.run(
        [str(py), "-c", PROBE],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={k: v for k, v in env.items() if k != "PYTHONPATH"},
    )
    assert out.returncode == 0, out.stderr
    import json

    found = json.loads(out.stdout)
    assert not found["top_collectors"] and not found["top_app"]
    if editable:
        site = next(env_dir.glob("lib/python*/site-packages"))
        assert list(site.glob("__editable__*tracelab*")), "the editable install went elsewhere"
        assert found["collectors"].startswith(str(REPO / "collectors"))
        assert found["app"].startswith(str(REPO / "app"))
    else:
        assert str(env_dir) in found["tracelab"] and str(env_dir) in found["collectors"]
    cli = subprocess.run(
        [str(env_dir / "bin" / "tracelab"), "--help"], capture_output=True, text=True
    )
    assert cli.returncode == 0 and "ingest" in cli.stdout
