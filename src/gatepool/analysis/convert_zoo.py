"""``convert`` over a zoo: every torchvision classification model and one timm model per family.

For each model (random weights, ``pretrained=False``, nothing downloaded) and each gate, at the smallest of
``SIZES`` the original model accepts, batch 2:

    converts   ``convert(model, gate, global_pool=G, squeeze_pool=G)`` (G = the gate, "soft" for "conv")
    trains     a forward and a backward in train mode; finite outputs and gradients
    round trip a state_dict into a freshly converted copy (another seed): the same outputs in eval mode
    left       no pool of the original remains: no torch pool module convert did not build, and no pool
               function (F.max_pool*d, F.avg_pool*d, F.adaptive_avg_pool*d, a mean over (2, 3)) run in
               a forward outside the modules convert built (seen by a TorchFunctionMode)
    compiles   (``compile=True``) torch.compile(backend="eager") gives the eager output, where the
               original compiles

A row's status: "full" (every check passed, nothing left), "no pool" (nothing to convert), "partial"
(it runs, something is left: named), "refused" (convert raised: its message), "broken" (a check
failed after conversion: which and why), "skipped" (the original model runs at none of SIZES), or
"not compiled" (``compile=True``: converted fully, but the original does not compile: nothing to compare).
Needs torchvision and/or timm.
"""

from __future__ import annotations

import time
import traceback
import warnings
from dataclasses import asdict, dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from gatepool.layers import gate_table
from gatepool.layers.convert import ADAPTIVE_POOLS, POOLS, convert
from gatepool.layers.gated_pool import GATES

SIZES = (64, 96, 128, 224, 256)
CONVERTED = {"full", "not compiled"}  # converted fully ("not compiled": the original does not compile)
_POOL_FUNCTIONS = {getattr(F, f"{k}_pool{d}d") for k in ("max", "avg", "adaptive_avg") for d in (1, 2, 3)}
_POOL_FUNCTIONS |= {
    getattr(torch, f"{k}_pool{d}d")
    for k, d in (("max", 1), ("max", 2), ("max", 3), ("avg", 1), ("adaptive_avg", 1))
}
_POOL_FUNCTIONS |= {
    torch._C._nn.avg_pool2d,
    torch._C._nn.avg_pool3d,
    torch._C._nn.adaptive_avg_pool2d,
    torch._C._nn.adaptive_avg_pool3d,
}
_MEANS = {torch.mean, torch.Tensor.mean}
_POOL_MODULES = POOLS + ADAPTIVE_POOLS + (nn.AdaptiveMaxPool2d,)  # torch's, as left_over looks for them


@dataclass
class Result:
    model: str  # "tv:resnet18", "timm:resnet18"
    gate: str
    status: str  # full / partial / refused / broken / skipped
    size: int = 0
    replaced: int = 0
    functional: int = 0  # of which rewritten calls
    left: list[str] = field(default_factory=list)
    why: str = ""
    seconds: float = 0.0


def torchvision_models() -> list[str]:
    import torchvision

    return [f"tv:{n}" for n in torchvision.models.list_models(module=torchvision.models)]


def timm_families() -> list[str]:
    """One model per timm module (family): the smallest-sounding name of each."""
    import timm

    prefer = ("pico", "nano", "tiny", "small", "18", "b0", "_s", "mini", "xs", "lite", "050", "100")
    out = []
    for module in sorted(timm.list_modules()):
        names = sorted(timm.list_models(module=module))
        if not names:
            continue

        def rank(n):
            return (next((i for i, p in enumerate(prefer) if p in n), len(prefer)), len(n), n)

        out.append(f"timm:{min(names, key=rank)}")
    return out


def build(name: str, seed: int) -> nn.Module:
    lib, arch = name.split(":", 1)
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if lib == "tv":
            import torchvision

            kwargs = {"aux_logits": False} if arch in ("googlenet", "inception_v3") else {}
            if arch == "googlenet":
                kwargs["init_weights"] = True
            return torchvision.models.get_model(arch, weights=None, **kwargs)
        import timm

        return timm.create_model(arch, pretrained=False)


def _input(size: int) -> torch.Tensor:
    return torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(7))


def smallest_size(model: nn.Module) -> int | None:
    model.eval()
    for size in SIZES:
        try:
            with torch.no_grad():
                model(_input(size))
            return size
        except Exception:  # noqa: BLE001 - the model refuses this size: try the next
            continue
    return None


class _PoolCalls(TorchFunctionMode):
    """Records the pool functions run while no module convert built is running."""

    def __init__(self, stack: list):
        super().__init__()
        self.stack, self.seen = stack, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        pool = func in _POOL_FUNCTIONS
        if func in _MEANS and args and isinstance(args[0], torch.Tensor) and args[0].dim() in (4, 5):
            dims = args[1] if len(args) > 1 else kwargs.get("dim")
            if isinstance(dims, (tuple, list)):
                rank = args[0].dim()
                pool = sorted(d % rank for d in dims) == list(range(2, rank))
        inside = any(hasattr(m, "_gatepool_origin") for m in self.stack)  # a module convert built
        if pool and self.stack and type(self.stack[-1]) in _POOL_MODULES:
            inside = True  # torch's pool module runs it: left_over names that module
        if pool and not inside:
            owner = type(self.stack[-1]).__name__ if self.stack else "?"
            self.seen.append(f"{getattr(func, '__name__', func)} in {owner}")
        return func(*args, **kwargs)


def left_over(model: nn.Module, x: torch.Tensor) -> list[str]:
    """The original's pools still in ``model``: modules, and pool calls outside convert's modules."""
    converted = [n for n, m in model.named_modules() if hasattr(m, "_gatepool_origin")]
    left = [
        f"{n} ({type(m).__name__})"
        for n, m in model.named_modules()
        if type(m) in _POOL_MODULES
        and not any(n == c or n.startswith(c + ".") for c in converted)  # convert's (PoolSame's inner)
    ]
    stack: list = []

    def enter(m, args):
        stack.append(m)

    def leave(m, args, out):
        stack.pop()  # returns nothing: the output stays as it is

    pre = nn.modules.module.register_module_forward_pre_hook(enter)
    post = nn.modules.module.register_module_forward_hook(leave)
    mode = _PoolCalls(stack)
    try:
        with torch.no_grad(), mode:
            model.eval()(x)
    finally:
        pre.remove()
        post.remove()
    return left + sorted(set(mode.seen))


def check(name: str, gate: str, *, compile: bool = False, size: int | None = None) -> Result:
    start = time.perf_counter()
    g = "soft" if gate in gate_table.names(global_form=False) else gate  # "conv" has no global form
    try:
        size = size or smallest_size(build(name, 0))  # a size known (an earlier gate's): no build for it
        model = build(name, 0)
    except Exception as e:  # noqa: BLE001
        return Result(name, gate, "skipped", why=f"build: {_short(e)}")
    if size is None:
        return Result(name, gate, "skipped", why=f"the original runs at none of {SIZES}")
    x = _input(size)
    result = Result(name, gate, "full", size)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model, replaced = convert(model, gate, global_pool=g, squeeze_pool=g, example_input=x)
    except Exception as e:  # noqa: BLE001
        return Result(name, gate, "refused", size, why=_short(e), seconds=time.perf_counter() - start)
    result.replaced = len(replaced)
    result.functional = sum(r.source == "function" for r in replaced)
    notes = [str(w.message) for w in caught if "convert" in str(w.message)]
    step = "forward/backward"
    try:
        model.train()
        out = model(x)
        out = out[0] if isinstance(out, (tuple, list)) else getattr(out, "logits", out)
        out.float().square().mean().backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        assert out.isfinite().all() and all(g_.isfinite().all() for g_ in grads), "non-finite"
        step = "state_dict round trip"
        other, _ = convert(build(name, 1), gate, global_pool=g, squeeze_pool=g, example_input=x)
        other.load_state_dict(model.state_dict())
        model.eval(), other.eval()
        with torch.no_grad():
            torch.testing.assert_close(other(x), model(x), rtol=0, atol=0)
        step = "left"
        result.left = left_over(model, x)
        if compile:
            step = "torch.compile"
            torch._dynamo.reset()
            try:
                torch.compile(build(name, 0).eval(), backend="eager")(x)
                uncompiled = ""
            except Exception as e:  # noqa: BLE001 - the original does not compile: nothing to check
                uncompiled = f"the original does not compile: {_short(e)}"
            if not uncompiled:
                torch._dynamo.reset()
                with torch.no_grad():
                    torch.testing.assert_close(torch.compile(model, backend="eager")(x), model(x))
    except Exception as e:  # noqa: BLE001
        result.status, result.why = "broken", f"{step}: {_short(e)}"
    else:
        if result.left:
            result.status = "partial"
            result.why = "; ".join(notes)[:300]
        elif not replaced:
            result.status = "no pool"  # nothing to convert (a ViT): runs as it was
        elif compile and uncompiled:
            result.status, result.why = "not compiled", uncompiled  # converted fully; compile not checked
    result.seconds = time.perf_counter() - start
    return result


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200] if text else ''}" if text else type(e).__name__


def sweep(
    models: list[str], gates=GATES, *, compile: bool = False, log=None, sizes: dict[str, int] | None = None
) -> list[Result]:
    """``check`` each model with each gate; ``sizes``: a model's input size where known (another run's)."""
    results = []
    for name in models:
        size = (sizes or {}).get(name)
        for gate in gates:
            try:
                r = check(name, gate, compile=compile, size=size)
            except Exception:  # noqa: BLE001 - a bug here must not stop the sweep
                r = Result(name, gate, "broken", why=traceback.format_exc().splitlines()[-1][:200])
            size = r.size or size
            results.append(r)
            if log:
                log(r)
    return results


def table(results: list[Result], gates=GATES) -> str:
    """Markdown: one row per model, one column per gate (✓ full, ~ partial, ✗ refused/broken)."""
    mark = {"full": "✓", "not compiled": "○", "no pool": "·", "partial": "~", "refused": "✗", "broken": "✗",
            "skipped": "–"}  # fmt: skip
    by_model: dict[str, dict[str, Result]] = {}
    for r in results:
        by_model.setdefault(r.model, {})[r.gate] = r
    lines = [
        "| model | size | " + " | ".join(gates) + " | notes |",
        "|---|---|" + "---|" * len(gates) + "---|",
    ]
    for model, row in by_model.items():
        notes = sorted(
            {
                f"{r.gate}: {r.status}: "
                + ", ".join(r.left[:3])
                + (" (" if r.left and r.why else "")
                + r.why
                + (")" if r.left and r.why else "")
                for r in row.values()
                if r.status not in ("full", "no pool")
            }
        )
        size = next((r.size for r in row.values() if r.size), "")
        lines.append(
            f"| {model} | {size} | "
            + " | ".join(mark[row[g].status] if g in row else " " for g in gates)
            + " | "
            + "; ".join(n.replace("|", "/") for n in notes)[:400]
            + " |"
        )
    return "\n".join(lines)


def summary(results: list[Result]) -> dict:
    models: dict[str, set[str]] = {}
    for r in results:
        models.setdefault(r.model, set()).add(r.status)
    full = sorted(m for m, s in models.items() if s <= CONVERTED)
    none = sorted(m for m, s in models.items() if s == {"no pool"})
    return {
        "models": len(models),
        "full": len(full),
        "no_pool": len(none),
        "not_full": sorted(set(models) - set(full) - set(none)),
        "results": [asdict(r) for r in results],
    }
