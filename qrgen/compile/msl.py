"""Metal Shading Language sources away from a Mac: their signature checked against the launch contract, linted
and parsed by clang as MSL (the check), and translated to run on the CPU (threads as fibers, built with the host's
C++ compiler) or on CUDA (NVRTC), so that the Metal kernels are verified where no Apple GPU is.

The launch contract (templates/metal/dialect.h): `kernel void NAME(` buffers [[buffer(0..)]] (device pointers,
then one `constant int*` of runtime arguments), one `threadgroup float*` [[threadgroup(0)]], then uint3
[[threadgroup_position_in_grid]], uint [[thread_index_in_threadgroup]], uint [[thread_index_in_simdgroup]] and uint
[[simdgroup_index_in_threadgroup]]. The translations strip the attributes, map MSL's names through a header
(templates/metal/layers/) and add a launcher that passes those arguments as the layer's threads see them."""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..paths import template_dir

KERNEL = re.compile(r"\bkernel\s+void\s+(\w+)\s*\((.*?)\)\s*\{", re.S)
PARAM = re.compile(r"^(?P<type>[\w\s*&]+?)\s*\b(?P<name>\w+)\s*\[\[\s*(?P<attr>[^\]]+?)\s*\]\]$", re.S)
ATTRIBUTE = re.compile(r"\s*\[\[[^\]]*\]\]")
POSITIONS = (("uint3", "threadgroup_position_in_grid"), ("uint", "thread_index_in_threadgroup"),
             ("uint", "thread_index_in_simdgroup"), ("uint", "simdgroup_index_in_threadgroup"))
# MSL has no double on Apple GPUs: a floating literal must say f (or h); nor these C++ features
DOUBLE_LITERAL = re.compile(r"(?<![\w.])(\d+\.\d*|\.\d+)([eE][-+]?\d+)?(?![\w.])")
FORBIDDEN = re.compile(r"\b(double|goto|new|delete|virtual|throw|try|catch|thread_local|dynamic_cast)\b")
COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
TG_DECLARATION = re.compile(r"\bthreadgroup\s+[\w:<>, ]+\s+\w+\s*\[")
THREADGROUP_BYTES = 32 * 1024
THREADS = 1024


@dataclass(frozen=True)
class Buffer:
    ctype: str  # the parameter's type without its address space ("const float*")
    space: str  # "device" or "constant"


@dataclass(frozen=True)
class Signature:
    name: str
    buffers: tuple[Buffer, ...]  # in [[buffer(i)]] order; the last is the runtime arguments (constant int*)


def _layer(name: str) -> str:
    return (template_dir() / "metal" / "layers" / name).read_text()


def signature(source: str, name: str) -> Signature:
    """The kernel's signature, or a ValueError naming the parameter that breaks the launch contract."""
    found = [m for m in KERNEL.finditer(COMMENT.sub("", source)) if m.group(1) == name]
    if len(found) != 1:
        raise ValueError(f"{name}: expected one `kernel void {name}(...)`, found {len(found)}")
    params = [p.strip() for p in found[0].group(2).split(",")]
    parsed = []
    for text in params:
        m = PARAM.match(text)
        if m is None:
            raise ValueError(f"{name}: parameter {text!r} has no [[attribute]] (every kernel parameter needs one)")
        parsed.append((" ".join(m.group("type").split()), m.group("attr").replace(" ", "")))
    buffers = []
    for i, (ctype, attr) in enumerate(parsed):
        if not attr.startswith("buffer("):
            break
        if attr != f"buffer({i})":
            raise ValueError(f"{name}: parameter {i} is {attr}, expected buffer({i}) (buffers come first, in order)")
        space, _, rest = ctype.partition(" ")
        if space not in ("device", "constant") or not rest.endswith("*"):
            raise ValueError(f"{name}: buffer({i}) is {ctype!r}: a buffer is a device or constant pointer")
        buffers.append(Buffer(rest, space))
    if not buffers or buffers[-1] != Buffer("int*", "constant"):
        raise ValueError(f"{name}: the last buffer must be the runtime arguments, `constant int*`")
    rest = parsed[len(buffers):]
    expected = [("threadgroup float*", "threadgroup(0)")] + [(t, a) for t, a in POSITIONS]
    if rest != expected:
        raise ValueError(f"{name}: after the buffers expected {expected}, found {rest}")
    return Signature(name, tuple(buffers))


def lint(source: str, name: str) -> None:
    """ValueError where the source uses what MSL on Apple GPUs lacks (double, C++ features MSL leaves out) or
    declares threadgroup variables (threadgroup memory comes as the kernel argument only, sized by the host)."""
    code = COMMENT.sub("", source)
    for pattern, what in ((DOUBLE_LITERAL, "a double literal (write 1.0f)"), (FORBIDDEN, "a word MSL does not have"),
                          (TG_DECLARATION, "a threadgroup variable (pass threadgroup memory as the argument)")):
        m = pattern.search(code)
        if m:
            line = code[:m.start()].count("\n") + 1
            raise ValueError(f"{name}: line {line}: {what}: {m.group(0)!r}")


def clang_check(source: str, name: str) -> None:
    """Parse the source as MSL with clang (libclang) over templates/metal/layers/check.h, its [[attributes]] left
    out (signature() checks them): a RuntimeError lists the errors. Needs the libclang package."""
    try:
        from clang import cindex
    except ImportError:
        raise RuntimeError("the Metal source check needs libclang: pip install libclang") from None
    header = _layer("check.h")
    shift = header.count("\n")  # the header's lines, in place of the include's
    # the attributes were checked by signature(); clang would read [[threadgroup(0)]] through the macro
    text = ATTRIBUTE.sub("", source.replace("#include <metal_stdlib>\n", header))
    index = cindex.Index.create()
    unit = index.parse(f"{name}.cpp", args=["-x", "c++", "-std=c++14", "-fsyntax-only", "-Wno-unknown-attributes"],
                       unsaved_files=[(f"{name}.cpp", text)])
    errors = [d for d in unit.diagnostics if d.severity >= cindex.Diagnostic.Error]
    if errors:
        lines = [f"line {d.location.line - shift + 1}: {d.spelling}" for d in errors[:12]]
        raise RuntimeError(f"{name}: {len(errors)} error(s) as MSL:\n" + "\n".join(lines))


def check(source: str, name: str) -> Signature:
    """Everything that can be checked of a Metal kernel without the Metal compiler: signature, lint, clang."""
    sig = signature(source, name)
    lint(source, name)
    clang_check(source, name)
    return sig


def _body(source: str, layer: str) -> str:
    fibers = (template_dir() / "host" / "fibers.h").read_text() if layer == "cpu.h" else ""
    prelude = fibers + _layer(layer) + _layer("common.h")
    return ATTRIBUTE.sub("", source.replace("#include <metal_stdlib>", prelude))


def _ctype(b: Buffer) -> str:
    return ("const " if b.space == "constant" else "") + b.ctype


def _call(sig: Signature, pointers: list[str], tg: str, group: str, t: str) -> str:
    return f"{sig.name}({', '.join(pointers)}, {tg}, {group}, {t}, {t} & 31, {t} >> 5)"


def to_cuda(source: str, name: str) -> tuple[str, Signature]:
    """The source as CUDA with a launcher `<name>__msl` (buffers in order, the threadgroup memory as dynamic shared
    memory), and the signature."""
    sig = signature(source, name)
    params = ", ".join(f"{_ctype(b)} p{i}" for i, b in enumerate(sig.buffers))
    call = _call(sig, [f"p{i}" for i in range(len(sig.buffers))], "qrl_tg",
                 "make_uint3(blockIdx.x, blockIdx.y, blockIdx.z)", "threadIdx.x")
    launcher = (f'\nextern "C" __global__ void __launch_bounds__({THREADS}) {name}__msl({params}) {{\n'
                f"  extern __shared__ float qrl_tg[];\n  {call};\n}}\n")
    return _body(source, "cuda.h") + launcher, sig


def to_cpu(source: str, name: str) -> tuple[str, Signature]:
    """The source as C++ for the host with a launcher `int <name>__launch(void** buffers, float* tg, int gx, int gy,
    int gz, int threads, int tg_floats)` (0, or 1 where a threadgroup deadlocked), and the signature."""
    sig = signature(source, name)
    pointers = [f"({_ctype(b)})a->p[{i}]" for i, b in enumerate(sig.buffers)]
    call = _call(sig, pointers, "a->tg", "a->group", "t")
    launcher = f"""
struct {name}__args {{ void* p[{len(sig.buffers)}]; float* tg; int tg_floats; uint3 group; }};
static void {name}__body(void* closure, int t) {{
  {name}__args* a = ({name}__args*)closure;
  {call};
}}
extern "C" int {name}__launch(void** p, float* tg, int gx, int gy, int gz, int threads, int tg_floats) {{
  {name}__args a;
  for (int i = 0; i < {len(sig.buffers)}; ++i) a.p[i] = p[i];
  a.tg = tg;
  a.tg_floats = tg_floats;
  for (int z = 0; z < gz; ++z)
    for (int y = 0; y < gy; ++y)
      for (int x = 0; x < gx; ++x) {{
        for (int i = 0; i < tg_floats; ++i) tg[i] = __builtin_nanf("");  // Metal leaves it undefined
        a.group = uint3{{(unsigned)x, (unsigned)y, (unsigned)z}};
        if (qrl::run_group(threads, {name}__body, &a)) return 1;
      }}
  return 0;
}}
"""
    return _body(source, "cpu.h") + launcher, sig


def check_launch(name: str, threads: int, tg_floats: int) -> None:
    """Apple's limits on a dispatch, as a Mac enforces them: a ValueError beyond them."""
    if threads % 32 or not 32 <= threads <= THREADS:
        raise ValueError(f"{name}: {threads} threads per threadgroup; Metal allows multiples of 32 up to "
                         f"{THREADS} here")
    if not 0 < 4 * tg_floats <= THREADGROUP_BYTES:
        raise ValueError(f"{name}: {4 * tg_floats} bytes of threadgroup memory; Apple GPUs allow {THREADGROUP_BYTES}")
