"""Build ferry's Python package: the extension ferry._ferry is compiled from the
library's C sources (src/) and python/ferry/_ferry.c into one module, so a
plain `pip install .` needs only a C compiler and the zstd, lz4 and zlib
development files. The version comes from include/ferry.h.

The Makefile builds the same module in place (python/ferry/_ferry$(EXT_SUFFIX))
from build/libferry.a; an editable install (`pip install -e .`, tools/setup.sh)
writes the same file, and whichever ran last is used: both are built from the
same sources."""
import glob
import os
import re
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


def version():
    with open(os.path.join(HERE, "include", "ferry.h")) as f:
        m = re.search(r'#define\s+FERRY_VERSION_STRING\s+"([^"]+)"', f.read())
    if not m:
        raise RuntimeError("FERRY_VERSION_STRING not found in include/ferry.h")
    return m.group(1)


def rel(p):
    return os.path.relpath(p, HERE)


LIB_SOURCES = sorted(rel(p) for d in ("engine", "cuda", "formats", "codecs")
                     for p in glob.glob(os.path.join(HERE, "src", d, "*.c")))


class BuildExt(build_ext):
    """Adds the embedded GPU kernels: build/kernels_fatbin.c when `make` made
    it (nvcc present), else tools/embed.sh of an empty blob (CPU fallbacks)."""

    def build_extensions(self):
        made = os.path.join(HERE, "build", "kernels_fatbin.c")
        if os.path.exists(made):
            src = made
        else:
            os.makedirs(self.build_temp, exist_ok=True)
            blob = os.path.join(self.build_temp, "kernels.fatbin")
            open(blob, "wb").close()
            src = os.path.join(self.build_temp, "kernels_fatbin.c")
            with open(src, "w") as out:
                subprocess.check_call(["bash", os.path.join(HERE, "tools", "embed.sh"),
                                       "ferry_kernels_fatbin", blob], stdout=out)
        for ext in self.extensions:
            if src not in ext.sources:
                ext.sources.append(src)
        super().build_extensions()


deps = os.path.join(HERE, ".deps")
ext = Extension(
    "ferry._ferry",
    sources=["python/ferry/_ferry.c"] + LIB_SOURCES,
    include_dirs=["include", "src", os.path.join(deps, "include")],
    library_dirs=[os.path.join(deps, "lib")] if os.path.isdir(os.path.join(deps, "lib")) else [],
    libraries=["zstd", "lz4", "z", "dl", "pthread", "m"],
    extra_compile_args=["-std=c11", "-D_GNU_SOURCE", "-pthread", "-O2", "-fvisibility=hidden"],
    extra_link_args=["-pthread"],
)

if __name__ == "__main__":
    if sys.platform != "linux":
        sys.stderr.write("ferry builds on Linux only\n")
    # setuptools' own build tree lives apart from the Makefile's objects
    setup(version=version(), ext_modules=[ext], cmdclass={"build_ext": BuildExt},
          options={"build": {"build_base": os.path.join("build", "py")}})
