"""A client environment the testbed's hosts do not have (``conda=True`` tests)."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path


def client_venv(d: Path, pkg: str) -> Path:
    """A small venv at ``d/clientenv`` holding package ``pkg`` (``VALUE = 1``),
    which the hosts' interpreter (the project venv) cannot import; monarch and
    its dependencies come from the project venv through a ``.pth`` file (its
    own ``.pth`` files run too: editable installs)."""
    venv = d / "clientenv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               check=True, timeout=60, capture_output=True, text=True).stdout.strip())
    (site / "project_venv.pth").write_text(f"import site; site.addsitedir({sysconfig.get_path('purelib')!r})\n")
    (site / pkg).mkdir()
    (site / pkg / "__init__.py").write_text("VALUE = 1\n")
    return venv
