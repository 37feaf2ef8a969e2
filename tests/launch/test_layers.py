"""Arrows point down: the kernel never imports the launch layer (or anything above it)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_the_kernel_imports_neither_launch_nor_actor_modules() -> None:
    code = (
        "import json, sys; import monarch_core._kernel._runtime, monarch_core._kernel._inbound, "
        "monarch_core._kernel._wire; "
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('monarch_core._launch', "
        "'monarch_core._actor', 'monarch_core._mesh')))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_the_launch_package_library_modules_do_not_import_the_mesh_layer() -> None:
    code = (
        "import json, sys; import monarch_core._launch._spec, monarch_core._launch._children, "
        "monarch_core._launch._spawn, monarch_core._launch._bootstrap; "
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('monarch_core._actor._mesh', "
        "'monarch_core._mesh')))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
