"""The fused soft-pool kernels for the CPU: the C build (``kernels/softmax_pool.c``), its ctypes boundary,
and the C++ operator around the same kernels (``kernels/softmax_pool_op.cpp``).

Build: ``cc -O3 -march=native -fno-trapping-math -ffp-contract=off -fopenmp -shared`` of
``kernels/softmax_pool.c`` into ``~/.cache/gatepool/kernels/`` (``$XDG_CACHE_HOME`` respected), named by
a hash of the source, the compiler's version and this CPU's flags: about a second, once per machine;
concurrent builds each write a temporary file and rename it into place. Where the build fails (no
compiler) one warning says so, and with ``GATEPOOL_KERNELS=0`` none is tried; then :func:`available` is
False and the soft pools keep their pure-PyTorch paths.

The operator ``gatepool::softmax_pool_eager`` (:func:`eager_op`: the kernels with their autograd in C++,
the eager CPU path's one call forward and one node backward) is built beside it the same way, with
``c++`` against the running torch's headers and libraries (its version in the name): about 20 seconds,
once per machine and torch. Where that fails, one warning says so and the eager CPU calls take the
Python op ``gatepool::softmax_pool`` (the same kernels, more per-call time).

The C boundary is declared once on each side: the C file's structs ``gp_geometry`` and ``gp_tensors``
are :class:`Geometry` and :class:`Tensors` here, every exported function's types are in
:data:`FUNCTIONS`, and :func:`load` compares the structs field by field (offset and size) with the
library's ``gp_layout()``, raising a RuntimeError that names the first difference.
"""

import ctypes
import functools
import hashlib
import os
import platform
import subprocess
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from gatepool.layers.windows import PoolGeometry
from gatepool.utils.environment import cache_dir

__all__ = [
    "DTYPES",
    "Tensors",
    "available",
    "build",
    "build_op",
    "call",
    "eager_op",
    "geometry_struct",
    "kernel",
    "layout",
    "load",
]

SOURCE = Path(__file__).with_name("kernels") / "softmax_pool.c"
OP_SOURCE = SOURCE.with_name("softmax_pool_op.cpp")
# -fno-trapping-math: the clamps and selects on floats may be if-converted, so the channel loops vectorize;
# -ffp-contract=off: each product rounded as written (gcc would fuse a · b + c where its passes happen to
# meet one, differently in each element type's copy), so the backward's z − m is the forward's to the bit
# and float16 / bfloat16 are float32's results rounded once
FLAGS = ["-O3", "-march=native", "-fno-trapping-math", "-ffp-contract=off", "-fopenmp", "-fPIC", "-shared"]
if platform.machine().lower() in ("x86_64", "amd64"):
    FLAGS.insert(2, "-mprefer-vector-width=512")  # whole AVX-512 registers where the CPU has them
# the kernels' element types in memory (float16 / bfloat16 computed in float32 inside)
DTYPES = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16"}


# ----------------------------------------------------------------------------------------------- build


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return ""


def _version(compiler: str) -> str:
    return subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True).stdout


def _cached(folder: Path, stem: str, key: bytes, make: Callable[[str], None]) -> Path:
    """``folder/stem-HASH.so``, HASH of ``key`` (what the build depends on), made by ``make(temporary path)``
    unless it is there: each build writes its own temporary file and renames it into place (concurrent
    builds are safe)."""
    lib = folder / f"{stem}-{hashlib.sha256(key).hexdigest()[:16]}.so"
    if not lib.exists():
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{lib.name}.", suffix=".tmp", dir=folder)
        os.close(fd)
        try:
            make(tmp)
            os.replace(tmp, lib)
        finally:
            for leftover in (tmp, tmp + ".o"):
                if os.path.exists(leftover):
                    os.unlink(leftover)
    return lib


def _run(*command: str) -> None:
    subprocess.run(command, capture_output=True, text=True, check=True)


def build(source: Path = SOURCE, folder: Path | None = None, cc: str | None = None) -> Path:
    """Compile ``source`` (and the headers beside it) into ``folder`` unless it is there; the library's path.

    Named by a hash of the sources, the compiler's version, the flags and this CPU's, so a changed source or
    machine builds anew. Raises OSError or subprocess.CalledProcessError where it cannot build.
    """
    cc = cc or os.environ.get("CC", "cc")
    sources = [source, *sorted(source.parent.glob("*.h"))]
    key = b"".join(p.read_bytes() for p in sources) + (_version(cc) + " ".join(FLAGS) + _cpu_flags()).encode()
    return _cached(folder or cache_dir() / "kernels", source.stem, key,
                   lambda tmp: _run(cc, *FLAGS, "-o", tmp, str(source), "-lm"))  # fmt: skip


def build_op(folder: Path | None = None, cc: str | None = None, cxx: str | None = None) -> Path:
    """Compile ``kernels/softmax_pool_op.cpp`` with the C kernels into a torch operator library for the
    running torch (its headers, libraries and version); the library's path, as :func:`build`."""
    from torch.utils import cpp_extension

    cc, cxx = cc or os.environ.get("CC", "cc"), cxx or os.environ.get("CXX", "c++")
    torch_lib = str(Path(torch.__file__).parent / "lib")
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    includes = [f"-I{p}" for p in cpp_extension.include_paths()]
    cxx_flags = ["-O2", "-std=c++20", "-fPIC", "-shared", "-fopenmp", abi, *includes]
    sources = [SOURCE, OP_SOURCE, *sorted(SOURCE.parent.glob("*.h"))]
    key = b"".join(p.read_bytes() for p in sources) + " ".join(
        [_version(cc), _version(cxx), *FLAGS, *cxx_flags, _cpu_flags(), torch.__version__, torch_lib]
    ).encode()

    def make(tmp: str) -> None:
        _run(cc, *[f for f in FLAGS if f != "-shared"], "-c", "-o", tmp + ".o", str(SOURCE))
        _run(cxx, *cxx_flags, "-o", tmp, str(OP_SOURCE), tmp + ".o", f"-L{torch_lib}", "-lc10", "-ltorch_cpu",
             f"-Wl,-rpath,{torch_lib}", "-lm")  # fmt: skip

    return _cached(folder or cache_dir() / "kernels", OP_SOURCE.stem, key, make)


@functools.lru_cache(maxsize=1)
def _library() -> ctypes.CDLL | None:
    """The compiled kernels, built now if this machine has none yet; None (warned once) if they cannot be."""
    if os.environ.get("GATEPOOL_KERNELS", "1") == "0":
        return None
    try:
        return load(build())
    except (OSError, subprocess.CalledProcessError) as e:
        _warn(e, os.environ.get("CC", "cc"), "the fused soft-pool kernels",
              "the soft pools use the pure-PyTorch paths (1.2–4× slower on tiling windows, 25–100× where "
              "windows overlap). Install a C compiler (gcc) to get them")  # fmt: skip
        return None


@functools.lru_cache(maxsize=1)
def eager_op() -> torch._ops.OpOverload | None:
    """``torch.ops.gatepool.softmax_pool_eager.default``, its library built now if need be and loaded once;
    None (warned once) where it cannot be built, or the C kernels are not there."""
    if _library() is None:
        return None
    try:
        torch.ops.load_library(str(build_op()))
    except (OSError, subprocess.CalledProcessError) as e:
        _warn(e, os.environ.get("CXX", "c++"), "the C++ operator of the fused soft-pool kernels",
              "eager calls on the CPU take the Python op (the same kernels, tens of microseconds more a "
              "call). Install a C++ compiler (g++) to get it")  # fmt: skip
        return None
    return torch.ops.gatepool.softmax_pool_eager.default


def _warn(e: Exception, compiler: str, what: str, consequence: str) -> None:
    lines = e.stderr.strip().splitlines() if isinstance(e, subprocess.CalledProcessError) and e.stderr else []
    detail = next((line for line in lines if "error" in line), lines[-1]) if lines else e  # the first error
    warnings.warn(f"gatepool: {what} could not be built with {compiler!r} ({detail}); {consequence}.",
                  RuntimeWarning, stacklevel=4)  # fmt: skip


# -------------------------------------------------------------------------------------- the C boundary
# Declared once: the two structs of softmax_pool.c and every exported function's types. load() checks the
# structs against the library's own account of them (gp_layout), so a change on one side only fails there.


class Geometry(ctypes.Structure):
    """``gp_geometry``: the pool's sizes, 3-D (1-D and 2-D pools lead with sizes 1, padding 0)."""

    _fields_ = [
        ("n", ctypes.c_int64),
        ("c", ctypes.c_int64),
        ("cs", ctypes.c_int64),  # score channels: c, or 1 (one score per position)
        ("ca", ctypes.c_int64),  # temperatures: c, or 1
        ("in_size", ctypes.c_int64 * 3),
        ("out_size", ctypes.c_int64 * 3),
        ("kernel", ctypes.c_int64 * 3),
        ("stride", ctypes.c_int64 * 3),
        ("padding", ctypes.c_int64 * 3),
        ("dilation", ctypes.c_int64 * 3),
    ]


class Tensors(ctypes.Structure):
    """``gp_tensors``: the operands' addresses (channels-last memory), None where one is absent."""

    _fields_ = [(name, ctypes.c_void_p) for name in ("v", "s", "a", "w", "out", "stats", "gout")] + [
        (name, ctypes.c_void_p) for name in ("gv", "gs", "ga", "gw")
    ]


_STRUCTS = {"gp_geometry": Geometry, "gp_tensors": Tensors}
_CALL = [ctypes.POINTER(Geometry), ctypes.POINTER(Tensors), ctypes.c_int]  # (geometry, tensors, threads)
FUNCTIONS = {  # name: (argtypes, restype)
    "gp_layout": ([ctypes.c_char_p, ctypes.c_int64], ctypes.c_int64),
    **{f"softmax_pool_forward_{t}": (_CALL, ctypes.c_int64) for t in DTYPES.values()},  # -> non-finite count
    **{f"softmax_pool_backward_{t}": (_CALL, None) for t in DTYPES.values()},
}


def layout(structs: dict[str, type[ctypes.Structure]] = _STRUCTS) -> str:
    """The structs as ``gp_layout`` writes them: ``"S size"``, then ``"S.field offset size"`` per field."""
    lines = []
    for name, cls in structs.items():
        lines.append(f"{name} {ctypes.sizeof(cls)}")
        lines += [f"{name}.{f} {getattr(cls, f).offset} {getattr(cls, f).size}" for f, _ in cls._fields_]
    return "".join(line + "\n" for line in lines)


def load(path: Path, structs: dict[str, type[ctypes.Structure]] = _STRUCTS) -> ctypes.CDLL:
    """The library at ``path`` with :data:`FUNCTIONS` declared, once its structs match ``structs``.

    Raises RuntimeError naming the first line where the C side's layout and the ctypes one differ.
    """
    lib = ctypes.CDLL(str(path))
    for name, (argtypes, restype) in FUNCTIONS.items():
        fn = getattr(lib, name)  # AttributeError: a function missing on the C side
        fn.argtypes, fn.restype = argtypes, restype
    buf = ctypes.create_string_buffer(4096)
    if lib.gp_layout(buf, len(buf)) >= len(buf):
        raise RuntimeError(f"{path.name}: gp_layout's text does not fit {len(buf)} bytes")
    theirs, ours = buf.value.decode().splitlines(), layout(structs).splitlines()
    if theirs != ours:
        first = next((i for i, (a, b) in enumerate(zip(theirs, ours)) if a != b), min(len(theirs), len(ours)))
        c_line = theirs[first] if first < len(theirs) else "(nothing)"
        py_line = ours[first] if first < len(ours) else "(nothing)"
        raise RuntimeError(
            f"{path.name}: the C structs and c_kernels.py's ctypes copies disagree at line {first + 1} "
            f"of the layout: C says {c_line!r}, Python says {py_line!r}; change both sides together"
        )
    return lib


@torch.compiler.assume_constant_result  # torch.compile asks once, at trace time
def available() -> bool:
    """Are the fused CPU kernels built and loaded (building them now if need be)?"""
    return _library() is not None


@functools.lru_cache(maxsize=1024)
def geometry_struct(geo: PoolGeometry, n: int, c: int, cs: int, ca: int) -> Geometry:
    """The C side's :class:`Geometry` of ``geo``, its sizes padded to 3-D."""
    lead = 3 - geo.dim

    def three(t: tuple[int, ...], fill: int) -> ctypes.Array:
        return (ctypes.c_int64 * 3)(*([fill] * lead + list(t)))

    return Geometry(n, c, cs, ca, three(geo.in_size, 1), three(geo.out_size, 1), three(geo.kernel_size, 1),
                    three(geo.stride, 1), three(geo.padding, 0), three(geo.dilation, 1))  # fmt: skip


def kernel(direction: str, dtype: torch.dtype) -> ctypes._CFuncPtr:
    """The C function ``softmax_pool_{direction}`` of ``dtype``, its types declared: called as
    ``kernel(byref(geometry), byref(tensors), threads)`` (a :class:`Geometry`, a :class:`Tensors`)."""
    lib = _library()
    if lib is None:
        raise RuntimeError(
            "gatepool's fused kernels are not built here (see the warning, or "
            "GATEPOOL_KERNELS=0); check gatepool.layers.c_kernels.available() first"
        )
    return getattr(lib, f"softmax_pool_{direction}_{DTYPES[dtype]}")


def call(direction: str, geometry: Geometry, threads: int, **tensors: torch.Tensor | None) -> int | None:
    """Run ``softmax_pool_{direction}`` on ``tensors`` (:class:`Tensors`' fields: v, s, out, gout, gv and gs
    in v's dtype, the rest, a, w, stats, ga and gw, in its compute dtype, float32 for float16 / bfloat16;
    the caller keeps each alive for the call: a temporary's memory is reused)."""
    fn = kernel(direction, tensors["v"].dtype)
    ptrs = Tensors(**{k: None if t is None else t.data_ptr() for k, t in tensors.items()})
    return fn(ctypes.byref(geometry), ctypes.byref(ptrs), threads)
