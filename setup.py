"""Build ferry's Python package (distribution name `ferry-io`; import name `ferry`).

- The extension ferry._ferry is compiled from the library's C sources (src/)
  and python/ferry/ext/*.c into one module, so a plain `pip install .` needs
  only a C compiler and the zstd, lz4 and zlib development files. The version
  comes from include/ferry.h.
- The `ferry` command (src/cli/*.c, the real C program) is linked from the
  same objects and installed inside the package as ferry/_bin/ferry; the
  `ferry` console script (ferry._cli) execs it.
- GPU kernels (src/cuda/kernels.cu): compiled by nvcc when it is found ($NVCC,
  PATH, /usr/local/cuda/bin; NVCC=none skips it) and embedded; else a fatbin
  `make` already built (build/kernels.fatbin) is embedded; else none, and the
  library compiles kernels.cu (embedded as text) at run time with NVRTC, from
  the CUDA wheels torch brings; without NVRTC device-side steps such as
  byteswapping run on the CPU. `ferry info` and ferry.stats()["kernels"] say
  which.

The Makefile builds the same module in place (python/ferry/_ferry$(EXT_SUFFIX))
from build/libferry.a; an editable install (`pip install -e .`, tools/setup.sh)
writes the same file, and whichever ran last is used: both are built from the
same sources."""
import glob
import os
import re
import shutil
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


LIB_DIRS = ("base", "engine", "cuda", "formats", "formats/hdf5", "codecs", "sources")   # as the Makefile's
LIB_SOURCES = sorted(rel(p) for d in LIB_DIRS
                     for p in glob.glob(os.path.join(HERE, "src", d, "*.c")))
EXT_SOURCES = sorted(rel(p) for p in glob.glob(os.path.join(HERE, "python", "ferry", "ext", "*.c")))
CLI_SOURCES = sorted(rel(p) for p in glob.glob(os.path.join(HERE, "src", "cli", "*.c")))
# the same architectures as the Makefile's nvcc rule
NVCC_ARCH = ["-gencode", "arch=compute_90,code=sm_90", "-gencode", "arch=compute_80,code=sm_80",
             "-gencode", "arch=compute_75,code=compute_75"]


def find_nvcc():
    """$NVCC (NVCC=none: build without kernels), else nvcc on PATH or in /usr/local/cuda."""
    if os.environ.get("NVCC") == "none":
        return None
    for c in (os.environ.get("NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


class BuildExt(build_ext):
    """Embeds the GPU kernels, builds the extension, then links the `ferry`
    command from the extension's library objects and puts it in ferry/_bin."""

    def kernels_source(self):
        os.makedirs(self.build_temp, exist_ok=True)
        blob = os.path.join(self.build_temp, "kernels.fatbin")
        nvcc = find_nvcc()
        made = os.path.join(HERE, "build", "kernels.fatbin")
        if nvcc:
            self.announce(f"nvcc {nvcc}: compiling src/cuda/kernels.cu", level=2)
            subprocess.check_call([nvcc, "-fatbin", "-O3", *NVCC_ARCH, "-o", blob,
                                   os.path.join(HERE, "src", "cuda", "kernels.cu")])
        elif os.environ.get("NVCC") != "none" and os.path.isfile(made) and os.path.getsize(made) > 0:
            shutil.copyfile(made, blob)
        else:
            sys.stderr.write("ferry: no nvcc found: GPU kernels not embedded (byteswaps of device data run on "
                             "the CPU; `ferry info` says so). Set NVCC=/path/to/nvcc to build them.\n")
            open(blob, "wb").close()
        return self.embed("ferry_kernels_fatbin", blob, "kernels_fatbin.c")

    def embed(self, name, path, out_name):
        """tools/embed.sh NAME PATH into build_temp/out_name (rewritten only when it changes)."""
        src = os.path.join(self.build_temp, out_name)
        text = subprocess.check_output(["bash", os.path.join(HERE, "tools", "embed.sh"), name, path], text=True)
        old = open(src).read() if os.path.exists(src) else None
        if text != old:   # unchanged: keep the mtime, so an up-to-date extension is not rebuilt
            with open(src, "w") as out:
                out.write(text)
        return src

    def build_extensions(self):
        # the fatbin, and the kernels' text for NVRTC when there is none (src/cuda/nvrtc.c)
        gen = [self.kernels_source(),
               self.embed("ferry_kernels_cu", os.path.join(HERE, "src", "cuda", "kernels.cu"), "kernels_cu.c")]
        for ext in self.extensions:
            ext.sources += [g for g in gen if g not in ext.sources]
        super().build_extensions()
        self.build_cli(ext_modules[0], gen)

    def build_cli(self, ext, generated):
        lib_objs = self.compiler.object_filenames(LIB_SOURCES + generated, output_dir=self.build_temp)
        cli_objs = self.compiler.compile(CLI_SOURCES, output_dir=self.build_temp, include_dirs=ext.include_dirs,
                                         extra_postargs=ext.extra_compile_args)
        bindir = os.path.dirname(self.cli_path())
        os.makedirs(bindir, exist_ok=True)
        self.compiler.link_executable(cli_objs + lib_objs, "ferry", output_dir=bindir,
                                      libraries=ext.libraries, library_dirs=ext.library_dirs,
                                      extra_postargs=ext.extra_link_args)

    def cli_path(self):
        return os.path.join(self.build_lib, "ferry", "_bin", "ferry")

    def get_outputs(self):   # the wheel (and an editable install) carry the command too
        return super().get_outputs() + [self.cli_path()]

    def copy_extensions_to_source(self):   # --inplace / editable: beside the extension
        super().copy_extensions_to_source()
        pkg = self.get_finalized_command("build_py").get_package_dir("ferry")
        os.makedirs(os.path.join(pkg, "_bin"), exist_ok=True)
        self.copy_file(self.cli_path(), os.path.join(pkg, "_bin", "ferry"))


deps = os.path.join(HERE, ".deps")


def optional_libs():
    """The optional libraries whose headers are installed (tools/optional-libs.sh,
    the Makefile's list): their FERRY_HAVE_* macros and library names."""
    out = subprocess.run([os.path.join(HERE, "tools", "optional-libs.sh")], check=True,
                         capture_output=True, text=True).stdout
    inc = ["/usr/include", os.path.join(deps, "include")]
    try:
        arch = subprocess.run(["cc", "-print-multiarch"], capture_output=True, text=True).stdout.strip()
        if arch:
            inc.append(os.path.join("/usr/include", arch))
    except OSError:
        pass
    macros, libs = [], []
    for line in out.split("\n"):
        if line.strip():
            header, define, lib = line.split()
            if any(os.path.exists(os.path.join(d, header)) for d in inc):
                macros.append((define, None))
                libs.append(lib)
    return macros, libs


OPT_MACROS, OPT_LIBS = optional_libs()
ext_modules = [Extension(
    "ferry._ferry",
    sources=EXT_SOURCES + LIB_SOURCES,
    depends=sorted(rel(p) for p in glob.glob(os.path.join(HERE, "python", "ferry", "ext", "*.h"))),
    include_dirs=["include", "src", os.path.join(deps, "include")],
    library_dirs=[os.path.join(deps, "lib")] if os.path.isdir(os.path.join(deps, "lib")) else [],
    libraries=["zstd", "lz4", "z", *OPT_LIBS, "dl", "pthread", "m"],
    define_macros=OPT_MACROS,
    extra_compile_args=["-std=c11", "-D_GNU_SOURCE", "-pthread", "-O2", "-fvisibility=hidden"],
    extra_link_args=["-pthread"],
)]

if __name__ == "__main__":
    if sys.platform != "linux":
        sys.stderr.write("ferry builds on Linux only\n")
    # setuptools' own build tree lives apart from the Makefile's objects;
    # parallel compiles (the library is ~30 files)
    # (a build without kernels, NVCC=none, keeps its own tree: the two do not rebuild each other)
    setup(version=version(), ext_modules=ext_modules, cmdclass={"build_ext": BuildExt},
          options={"build": {"build_base": os.path.join("build", "py-nokernels" if os.environ.get("NVCC") == "none"
                                                        else "py")},
                   "build_ext": {"parallel": os.cpu_count() or 1}})
