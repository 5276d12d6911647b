"""The one build step pyproject.toml cannot say: ``traceml-otel-auto.pth`` at the root of site-packages.

Python runs the ``import`` lines of every ``*.pth`` file in site-packages at start-up. This one
(``traceml_otel/launch/traceml-otel-auto.pth``) costs one environment lookup while ``TRACEML_AUTO`` is
unset; set, it starts zero-code tracing (:mod:`traceml_otel.integrations.startup`) and, should that fail to
load, says so on one stderr line instead of stopping the interpreter (README, "Launching").

- A wheel (``pip install .``, ``pip wheel .``): ``build_py`` puts the file at the root of the build
  folder, which is the wheel's root, which pip installs into site-packages (and uninstalls with it).
- An editable install (``pip install -e .``, as ``scripts/setup.sh`` does): setuptools builds an
  "editable" wheel that holds only a path finder, not the build folder, so the file is added to the
  root of that wheel, with its RECORD line.
"""

from __future__ import annotations

import base64
import hashlib
import os
import zipfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH_SOURCE = Path(__file__).resolve().parent / "traceml_otel" / "launch" / "traceml-otel-auto.pth"
PTH_NAME = PTH_SOURCE.name


class BuildPyWithPth(build_py):
    """``build_py`` that also puts the start-up ``.pth`` at the wheel's root (not in editable mode)."""

    def run(self) -> None:
        super().run()
        if not self.editable_mode:
            self.copy_file(str(PTH_SOURCE), os.path.join(self.build_lib, PTH_NAME))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = list(super().get_outputs(include_bytecode))
        if not self.editable_mode:
            outputs.append(os.path.join(self.build_lib, PTH_NAME))
        return outputs


class EditableWheelWithPth(editable_wheel):
    """``editable_wheel`` whose wheel also holds the start-up ``.pth`` at its root."""

    def run(self) -> None:
        dist_dir = Path(self.dist_dir or "dist")
        before = set(dist_dir.glob("*.whl")) if dist_dir.is_dir() else set()
        super().run()
        built = set(Path(self.dist_dir).glob("*.whl")) - before
        if not built:
            raise RuntimeError(f"editable_wheel built no wheel in {self.dist_dir}; cannot add {PTH_NAME}")
        for wheel in built:
            add_to_wheel(wheel, PTH_NAME, PTH_SOURCE.read_bytes())


def add_to_wheel(wheel: Path, name: str, content: bytes) -> None:
    """Rewrite ``wheel`` with one more root file ``name`` and its line in ``*.dist-info/RECORD``."""
    with zipfile.ZipFile(wheel) as source:
        entries = [(info, source.read(info)) for info in source.infolist()]
    digest = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()
    line = f"{name},sha256={digest},{len(content)}\n".encode()
    partial = wheel.with_suffix(".partial")
    with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as target:
        target.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), content)
        for info, data in entries:
            if info.filename == name:
                continue
            if info.filename.endswith(".dist-info/RECORD"):
                data = line + data
            target.writestr(info, data)
    partial.replace(wheel)


setup(cmdclass={"build_py": BuildPyWithPth, "editable_wheel": EditableWheelWithPth})
