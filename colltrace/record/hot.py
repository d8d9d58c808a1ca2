"""The recorder's hot path as source: every template a generated function of the recorder is made from, and how
each function's source is put together from them.

A collective's wrapper, the recorder's issue, a span's begin and end and FSDP2's hook wrappers are generated
functions, one Python frame each, that inline what they do and take the wrapped function's own parameters: each
Python call left out is a few hundred instructions (docs/performance.md). Their templates are here, side by side,
so what runs reads in one file. The ring's own store (APPEND, FINISH, SLOT_WORD) is the trace writer's
(colltrace/trace/writer.py), the only other module with generated source; writer.hot_function compiles each
function and keeps its source (in linecache, for tracebacks and stack dumps, and in writer.GENERATED).
tests/snapshots/generated_hot_path.txt is the source of every generated function as it runs, held to it by
tests/test_record_generated.py: a change to a template shows there as a diff.

A template names the pieces it is made of as {placeholders}; the names its code refers to (PHASE_FORWARD, now,
NotMember, ...) are the generated function's namespace, given by the module that makes it (context.py,
recorder.py, shim.py, spans.py, fsdp.py, ops.py).
"""

from __future__ import annotations

import textwrap
from typing import Any

from colltrace.trace.writer import APPEND, finish_source, inline

# -- what a rank is doing (context.Context) ---------------------------------------------------------------------

# A forward's phase, with {ctx} the Context: a recompute while autograd runs a backward (activation checkpointing),
# else a forward. The one rule, for every framework's unshard and forward span (Context.forward_phase, and inlined
# where a generated hook decides: FORWARD_KIND, the FSDP2 hooks' templates).
FORWARD_PHASE = "PHASE_RECOMPUTE if {ctx}.graph_task_id() != -1 else PHASE_FORWARD"

# FRAME_SELF: from frame `f` up, the innermost (or, {keep} without a break, the outermost) frame running `call_code`
# (nn.Module.__call__, the way into every module's forward, compiled or not) whose `self` is `held`, then {keep}.
# Only f_back, f_code and f_locals: the frame API every Python that torch supports has (3.10-3.14; f_locals is a
# proxy from 3.13 on). Inlined where a collective's module is found (ATTRIBUTION), and in context._frame_self.
FRAME_SELF = """\
while f:
    if f.f_code is call_code:
        held = f.f_locals.get("self")
        if held is not None:
            {keep}
    f = f.f_back
"""

# _frame_self(call_code, f): the outermost module whose forward runs, from frame `f` up, or None
FRAME_SELF_BODY = (
    "    found = None\n" + textwrap.indent(FRAME_SELF.replace("{keep}", "found = held"), "    ") + "    return found\n"
)

# THREAD_STATE: this thread's ThreadState as `ts`, the hot paths' way (the shim's wrapper, FSDP2's hooks), with
# `current_ts` the get of the Context's ContextVar and `state` its state(). A thread starts with an empty context,
# so the variable is this thread's, and an asyncio task's copy of it too (a function run in a copy of another
# thread's context, as asyncio.to_thread runs it, shares that thread's state). Its get is a cached read where a
# threading.local's attribute is a lookup in the thread's own dict (callgrind: about 190 instructions against 500),
# and threads.get(get_ident()) makes a new int of the thread's id every time (800).
THREAD_STATE = """\
try:
    ts = current_ts()
except LookupError:  # the thread's first call (or a context made empty)
    ts = state()
"""


# ATTRIBUTION: `attribution`, what a collective issued now on thread state `ts` serves, with {ctx} the Context and
# {depth} the depth (sys._getframe's) of the frame that called the collective: an adapter's (module, phase,
# flavour) when one serves it (the site of its first call of that kind), else (module, phase, "", code, at), `code,
# at` the call instruction of that frame (its code's id and last instruction), which tell two call sites of the same
# kind of call apart in the recorder's cache, so each is recorded with its own site. The module is the innermost
# whose forward runs on this thread: from the frames (FRAME_SELF) where `call_code` is nn.Module.__call__'s
# code object, else from ThreadState.stack, kept by global module hooks. The phase: the user's label; else the one
# the work the thread is in holds (ThreadState.held: an optimizer step, checkpoint I/O); else backward (recompute
# inside a module) while autograd runs one; else forward inside a module; else Context.idle_phase. Inlined in the
# shim's wrapper, and Context.current.
ATTRIBUTION = """\
attribution = ts.serve
if attribution is None:
    caller = _getframe({depth})
    call_code = {ctx}.call_code
    if call_code is not None:
        f = caller.f_back  # the caller runs the collective, not a module's __call__
        module = ""
{walk}    else:
        stack = ts.stack
        module = stack[-1] if stack else ""
    if ts.labels:  # the user's own phase label wins over the inferred one
        phase = ts.labels[-1]
    elif ts.held:
        phase = ts.held
    elif {ctx}.graph_task_id() != -1:
        phase = PHASE_RECOMPUTE if module else PHASE_BACKWARD
    elif module:
        phase = PHASE_FORWARD
    else:
        phase = {ctx}.idle_phase
    attribution = (module, phase, "", id(caller.f_code), caller.f_lasti)  # by id: a code's hash reads its body
"""


def attribution_source(indent: int, ctx: str, depth: int) -> str:
    """ATTRIBUTION as source for a function that inlines it, {ctx} the Context, the collective's caller `depth`
    frames up from it."""
    keep = "module = {ctx}.module_name(held)\n            break"
    walk = textwrap.indent(FRAME_SELF.replace("{keep}", keep), " " * 8)
    source = ATTRIBUTION.replace("{walk}", walk).replace("{ctx}", ctx).replace("{depth}", str(depth))
    return textwrap.indent(source, " " * indent)


# Context.current(ts=None) -> (module, phase, flavour, code, at) for a collective issued now on this thread
# (ATTRIBUTION, from the frame of the caller of current's caller)
CURRENT_BODY = (
    "    if ts is None:\n        ts = self.state()\n" + attribution_source(4, "self", 2) + "    return attribution\n"
)
# Context.forward_phase() -> a forward's phase now (FORWARD_PHASE)
FORWARD_PHASE_BODY = f"    return {FORWARD_PHASE.format(ctx='self')}\n"


# -- a collective's slot (recorder.Recorder) ---------------------------------------------------------------------

# ISSUE: the slot of call `spec` with `key`, `attribution`, `t_issue` on thread state `ts` (the shim's wrapper
# and Recorder.issue inline it; {rec} the recorder, {ctx} its Context, {args} and {kwargs} the call's arguments)
# is `idx`; a call on a group this rank is not in (torch does nothing) raises NotMember instead, so the common case
# tests nothing for it. A training loop repeats the same few calls, so everything but seq, step and times is packed
# once per key and taken from the thread's cache afterwards. A plain call (blocking, on the host, no backend seq to
# read: `flags` 0 and `anchor` None) is one slot store here and one at its completion (FINISH); the others are
# completed by returned(idx, flags, anchor, ...).
ISSUE = """\
static = ts.static.get(key)  # never a None key: a call without one is packed afresh
if static is None:
    static = {rec}.miss(spec, key, attribution, ts, {args}, {kwargs})
    if static is None:
        raise NotMember
head, mid, counter, flags, ring, pg, _ = static
seq = counter.seq = counter.seq + 1
anchor = None
if seq >= counter.anchor_at:
    anchor = {rec}.anchor(pg, counter, flags, seq)
{append}"""


def issue_source(indent: int, rec: str, ctx: str, args: str, kwargs: str) -> str:
    """ISSUE, its slot's store (writer.APPEND) in place, as source for a function that inlines it."""
    append = inline(APPEND, 0, idx="idx", ring="ring", pack="pack_static",
                    fields=f"head, seq, mid, {ctx}.steps, t_issue")  # fmt: skip
    return inline(ISSUE, indent, rec=rec, args=args, kwargs=kwargs, append=append)


# Recorder.issue(self, spec, key, attribution, t_issue, ts, args, kwargs) -> (idx, flags), idx -1: not recorded
ISSUE_BODY = (
    "    try:\n"
    + issue_source(8, rec="self", ctx="self.ctx", args="args", kwargs="kwargs")
    + "    except NotMember:\n        return -1, 0\n    return idx, flags\n"
)


# -- the traced wrapper of a collective (shim.Shim) -------------------------------------------------------------

# Whether torch.compile or export is tracing, as source: torch.compiler.is_compiling() without its two frames.
# TorchDynamo folds is_dynamo_compiling() to True while it traces (a compiled function then sees the original
# collective: the same graph as untraced); eagerly it is False, and torch.compiler's flag, set around make_fx
# and export tracing, says the rest. is_compiling's first test, torch.jit.is_scripting(), is False in any Python
# call. The shim's wrapper inlines it; compiling_check() is it as a function.
COMPILING = "dynamo_compiling() or compiler_state._is_compiling_flag"
# compiling(): COMPILING as a function (shim.compiling_check)
COMPILING_BODY = f"    return {COMPILING}\n"


# The traced wrapper of one function, the body of `def {name}({params}):`. Plumbing only: what is recorded, and
# how, is ISSUE's (the slot at issue) and writer.FINISH's (a plain call's completion; the others go to
# Recorder.returned), inlined: each Python frame on this path costs more than the work it would hold
# (docs/performance.md). {params} is the function's own parameter list where ops.OpSpec has it, with {call}
# passing them on and {key} the call's key from them; else "*args, **kwargs", and extract finds the key.
WRAPPER = """\
    if {compiling}:  # TorchDynamo is tracing: it sees the original, as without colltrace
        return orig({call})
    rec = tracer.recorder
    if rec is None:
        return orig({call})
{thread_state}    if ts.depth:  # inside a traced call that forwards to another: recorded once
        return orig({call})
    t_issue = now()
    try:
{attribution}        try:
            key = {key}
        except AttributeError:  # not a tensor: torch will say so
            key = None
{issue}    except NotMember:  # torch does nothing either
        return orig({call})
    except Exception as e:  # the shim steps aside, the collective still runs
        tracer.failed(rec, "recording {name} failed", e)
        return orig({call})
    ts.depth = 1
    try:
        result = orig({call})
    except BaseException as e:
        ts.depth = 0
        rec.raised(idx, flags, e)
        raise
    ts.depth = 0
    try:  # never raises into the job: a failure is said once
        if flags or anchor is not None:  # async, on the device, or a backend seq to read
            rec.returned(idx, flags, anchor, result, t_issue)
        else:  # a blocking call on the host: blocked for its whole duration (its wait_ns, left 0, says so)
{finish}    except Exception as e:
        rec.warn_once("completing a collective failed", e)
    return result
"""


def wrapper_body(name: str, parts: dict[str, str]) -> str:
    """WRAPPER for one function, ISSUE and FINISH in place."""
    issue = issue_source(8, rec="rec", ctx="context", args=parts["args"], kwargs=parts["kwargs"])
    finish = finish_source(12, ring="ring", idx="idx", t_done="now()", wait=None)
    thread_state = textwrap.indent(THREAD_STATE, "    ")
    attribution = attribution_source(8, "context", 1)
    return WRAPPER.format(
        name=name, compiling=COMPILING, issue=issue, finish=finish, thread_state=thread_state,
        attribution=attribution, **parts,
    )  # fmt: skip


# names the wrapper uses itself (found by compiling it): a function with a parameter of one of these names gets
# *args, **kwargs (shim.Shim)
_code = compile("def f():\n" + wrapper_body("f", {"call": "", "key": "None", "args": "()", "kwargs": "{}"}), "", "exec")
WRAPPER_NAMES = frozenset(
    name for c in _code.co_consts if hasattr(c, "co_varnames") for name in (*c.co_varnames, *c.co_names)
) | {"args", "kwargs", "NO_KWARGS"}
del _code


# -- compute spans (spans.SpanRecorder) ---------------------------------------------------------------------------

# The hot paths of a span, as source for the generated functions that inline them (SpanRecorder.begin and end,
# FSDP2's hooks below), with {sp} the SpanRecorder. BEGIN: the span whose fixed part (writer.FIXED, packed once:
# SpanRecorder.fixed) is `fixed` begins now, its slot `idx` at word `slot_w` (writer.APPEND). END_AT: span `idx` at
# word `slot_w` of `ring` ends now (writer.FINISH: its end time, what says it ended; its wait stays 0). A span is
# known by both (spans.Token): finding the word from idx costs more than keeping it.
BEGIN = "ring = {sp}.ring\n" + inline(APPEND, 0, idx="idx", ring="ring", pack="pack_fixed",
                                     fields="fixed, ctx.steps, now()")  # fmt: skip
END_AT = finish_source(0, ring="ring", idx="idx", t_done="now()", wait=None)


def span_source(template: str, indent: int, sp: str) -> str:
    """BEGIN as source for a function that inlines it, {sp} its SpanRecorder (the variable holding it)."""
    return textwrap.indent(template.replace("{sp}", sp), " " * indent)


# SpanRecorder.begin(what, module="", flavour="") -> Token: the span's slot (BEGIN), its start now; all of it but
# step, micro-step and start packed once per kind of span of a thread (fixed)
SPAN_BEGIN_BODY = (
    "    fixed = self._static.get((get_ident(), what, module, flavour))\n"
    "    if fixed is None:\n"
    "        fixed = self.fixed(what, module, flavour)\n"
    "    ctx = self.ctx\n" + span_source(BEGIN, 4, "self") + "    return idx, slot_w\n"
)
# SpanRecorder.end(token, error=False): the span `begin` returned ends now (END_AT), marked failed when it raised
SPAN_END_BODY = (
    "    idx, slot_w = token\n"
    "    ring = self.ring\n"
    "    if error:\n"
    "        ring.complete(idx, now(), _ERROR)\n"
    "        return\n" + textwrap.indent(END_AT, "    ")
)

# FORWARD_KIND: a forward span's kind (`what`) and mode (`mode`) for {module} run now, with {ctx} the Context: recompute
# while autograd runs a backward (activation checkpointing), else forward (FORWARD_PHASE); mode `no_grad`
# (torch.no_grad, inference_mode) and/or `eval` (the module in eval mode), "" for a training forward. The one rule
# for every framework's forward span: spans.forward_kind, and inlined in FSDP2's forward hook (PRE_FORWARD).
FORWARD_KIND = f"""\
what = {FORWARD_PHASE}
if {{ctx}}.grad_enabled() and getattr({{module}}, "training", True):
    mode = ""
else:
    mode = forward_mode({{ctx}}.grad_enabled(), {{module}})
"""
# spans.forward_kind(ctx, module) -> (what, mode): FORWARD_KIND as a function
FORWARD_KIND_BODY = textwrap.indent(FORWARD_KIND.format(ctx="ctx", module="module"), "    ") + "    return what, mode\n"


# -- FSDP2's hooks (fsdp.fsdp2_wrappers) --------------------------------------------------------------------------

# What FSDP2's hooks run as: the method, with what the collectives it issues serve (module, phase, flavour) as the
# thread's serving scope, read from the unit's own state, and the unit's spans. No wrapper around
# FSDPParamGroup.unshard itself (a dozen calls a step, most of them FSDP's own no-ops): each of its callers is
# wrapped instead, FSDPState._pre_forward (the unit's forward unshard, and the recompute's under activation
# checkpointing), FSDPParamGroup.pre_backward (its backward unshard), _prefetch_unshard (the target's, a
# prefetch) and FSDPModule.unshard (the user's). One Python frame each, the decision inlined and the method's own
# parameters taken as they are ({call}, from ops.passthrough): adapter.scoped, the general form, costs three frames
# and an *args tuple and a **kwargs dict more per call (bench/shim_instructions.py). An error in the decision goes to
# `failed`, and the method runs unscoped. A compiled unit runs its hooks inside the graph TorchDynamo traces:
# nothing of ours then. SERVING: the method run with `serve` as what the thread's collectives serve (how each
# template that scopes ends).
SERVING = """\
    old = ts.serve
    ts.serve = serve
    try:
        return orig({call})
    finally:
        ts.serve = old
"""
PREFETCH = """\
    try:
{thread_state}        phase = PHASE_BACKWARD if {arg1} == "backward" else {forward_phase}
        unit = units.get({arg0})
        if unit is None or not unit.named:
            unit = group_unit({arg0})
        serve = (unit.serves[0][0], phase, PREFETCH)
    except Exception as e:
        failed(e)
        return orig({call})
{serving}"""
POST_BACKWARD = """\
    try:
{thread_state}        unit = units.get(self)
        if unit is None or not unit.named:
            unit = group_unit(self)
        old = ts.serve
        ts.serve = unit.serves[1]
    except Exception as e:
        failed(e)
        ts = unit = None
    try:
        return orig({call})
    finally:
        if ts is not None:
            ts.serve = old
{span_end}"""

# The spans of a unit: its forward (FSDPState's pre- to post-forward hook) and its backward (the param group's
# pre_backward to post_backward, above), each begun and ended inline (BEGIN, END_AT), its idx and word kept
# by its Unit, which keeps its fixed part too: a unit's module is named once. SPAN: `unit` begins a span of kind
# {what} and mode {mode} of module {name}, its kept fixed part good where {same} (the same recorder and thread;
# an FSDPState's forwards differ in kind and mode too, a param group's backward spans never do); SPAN_END: the
# span `unit` has open ends (then, on CUDA, MemorySampler.unit_end looks at the allocator's peak; it never
# raises). A compiled module runs its hooks inside the graph TorchDynamo traces: no span then. An error goes to `span_failed`, and the hook runs.
SPAN = """\
    sp = tracer.spans
    if sp is not None:
        try:
            if {same}:
                fixed = unit.fixed
            else:
                fixed = unit.fixed_of(sp, ts, {what}, {mode}, {name})
{begin}            unit.idx = idx
            unit.slot_w = slot_w
        except Exception as e:
            span_failed(e)
"""
SPAN_END = """\
        if unit is not None and unit.idx >= 0 and unit.sp is tracer.spans:
            idx = unit.idx
            unit.idx = -1
            slot_w = unit.slot_w
            ring = unit.sp.ring
{end}            if tracer.cuda_unit is not None:  # on CUDA: did the allocator's peak rise in this unit (memory.py)
                tracer.cuda_unit(unit)
"""
PRE_FORWARD = """\
    if {compiling}:
        return orig({call})
    try:
{thread_state}        if ctx.root is None:  # the model's first forward: learn its root
            ctx.learn_running()
        unit = units.get(self)
        if unit is None or not unit.named:
            unit = state_unit(self, {module})
{forward_kind}        # a forward while autograd runs a backward is activation checkpointing's recompute, whatever FSDP's own state
        # (PRE_BACKWARD where the unit's pre-backward hook ran first: FSDP then unshards only what a reshard undid)
        serve = unit.serves[0] if what is PHASE_FORWARD else unit.serves[1]
        if ts.labels:
            serve = (serve[0], serve[1], UNSHARD + ":" + ts.labels[-1])
    except Exception as e:
        failed(e)
        return orig({call})
{span_forward}{serving}"""
POST_FORWARD = """\
    try:
        return orig({call})
    finally:
        unit = units.get(self)
{span_end}"""
PRE_BACKWARD = """\
    if self._training_state is pre_backward:  # FSDP's own no-op
        return orig({call})
    try:
{thread_state}        unit = units.get(self)
        if unit is None or not unit.named:
            unit = group_unit(self)
        serve = unit.serves[0]
        if ts.labels:
            serve = (serve[0], serve[1], UNSHARD + ":" + ts.labels[-1])
    except Exception as e:
        failed(e)
        return orig({call})
{span_backward}{serving}"""
# the wrapper of each FSDP2 method, by name (fsdp.fsdp2_wrappers)
FSDP2_HOOKS = {"prefetch": PREFETCH, "post_backward": POST_BACKWARD, "pre_backward": PRE_BACKWARD,
               "pre_forward": PRE_FORWARD, "post_forward": POST_FORWARD}  # fmt: skip
# what a hook's source is given last, from the wrapped method's own parameters (fsdp2_source)
PLACEHOLDERS = ("{call}", "{module}", "{arg0}", "{arg1}")


def _fsdp2_parts() -> dict[str, str]:
    """The shared pieces the hook templates name ({span_forward}, {span_end}, ...), as source."""
    span = SPAN.replace("{begin}", span_source(BEGIN, 12, "sp"))
    same = "unit.sp is sp and unit.ts is ts"
    return {"span_forward": span.format(what="what", mode="mode", name="ctx.module_name({module})",
                                        same=same + " and unit.what is what and unit.mode == mode"),
            "span_backward": span.format(what="BACKWARD", mode='""', name="serve[0]", same=same),
            "span_end": SPAN_END.replace("{end}", textwrap.indent(END_AT, " " * 12)),
            "forward_kind": textwrap.indent(FORWARD_KIND.format(ctx="ctx", module="{module}"), " " * 8),
            "forward_phase": FORWARD_PHASE.format(ctx="ctx"), "compiling": COMPILING,
            "thread_state": textwrap.indent(THREAD_STATE, " " * 8), "serving": SERVING}  # fmt: skip


def fsdp2_body(name: str) -> str:
    """The body of FSDP2 hook `name`'s wrapper with its shared pieces in place, PLACEHOLDERS still to fill."""
    body = FSDP2_HOOKS[name]
    for part, source in _fsdp2_parts().items():
        body = body.replace("{" + part + "}", source)
    return body


def fsdp2_source(body: str, call: str, argv: list[str]) -> str:
    """A hook's body (fsdp2_body) for one method: {call} its arguments passed on, {arg0} and {arg1} its first two
    by position ({module}: the second, FSDPState._pre_forward's module)."""
    source = body.replace("{call}", call).replace("{module}", argv[1])
    return source.replace("{arg0}", argv[0]).replace("{arg1}", argv[1])


# -- reading a collective's arguments (ops.OpSpec) ------------------------------------------------------------------

# what extract reads of a call (ops.OpSpec.extract returns key, then call: the others, in this order)
EXTRACTED = ("key", "group", "async_op", "inp", "out", "redop", "root", "groot")
# what a key item is: the argument itself, or its .shape or .dtype (ops.key_plan)
KEY_VALUE, KEY_SHAPE, KEY_DTYPE = 0, 1, 2


def key_expr(plan: tuple[Any, ...], splits: tuple[str, ...], by_var: bool = False) -> str:
    """A call's key as an expression: of the parameters' names (the wrapper's), or of extract's variables
    (by_var). "None" for a spec whose calls are packed afresh each time; a call that passes an all-to-all's
    split sizes has no key. Its tensors' .shape and .dtype raise AttributeError when they are not tensors."""
    if not plan:
        return "None"
    key_id, items = plan
    attrs = {KEY_VALUE: "{}", KEY_SHAPE: "{}.shape", KEY_DTYPE: "{}.dtype"}
    # a reduce op by identity: its pybind __hash__ costs more than the rest of the key (the cached
    # slot keeps the op alive, so no other object can take its id while the key is in the cache)
    parts = [str(key_id)]
    for what, var, _, param, _ in items:
        by_id = var == "redop" and param == "op"
        parts.append((attrs[what] if not by_id else "id({})").format(var if by_var else param))
    key = f"({', '.join(parts)}, attribution)"
    if splits:
        key = f"None if {splits[0]} is not None or {splits[1]} is not None else {key}"
    return key


def extract_source(
    params: list[str], fields: tuple[tuple[str | None, Any], ...], plan: tuple[Any, ...], splits: tuple[str, ...] = ()
) -> str:
    """The body of `extract(args, kwargs, attribution) -> (key, call)` for one signature, as source indented by 4
    (call: the EXTRACTED values but key): each value is args[i] when passed by
    position, else kwargs.get(name, default); a parameter the function lacks is its default. The
    key holds the tensors' shape and dtype, never the tensors (see OpSpec). With `splits` (an
    all-to-all's input and output split-size parameters) call has an eighth value, the pair of
    them or None, and a call that passes them has no key."""
    names = EXTRACTED[1:]
    lines = ["    n = len(args)"]
    for var, (param, default) in zip(names, fields):
        if var == "out" and param == fields[2][0]:  # one tensor, in and out (all_reduce, broadcast)
            value = "inp"
        elif not param or param not in params:
            value = repr(default)
        else:
            i = params.index(param)
            value = f"args[{i}] if n > {i} else (kwargs.get({param!r}, {default!r}) if kwargs else {default!r})"
        lines.append(f"    {var} = {value}")
    if plan:
        lines += ["    try:", f"        key = {key_expr(plan, (), by_var=True)}",
                  "    except AttributeError:  # not a tensor: torch will say so", "        key = None"]  # fmt: skip
    else:
        lines.append("    key = None")
    if splits:
        got = [f"args[{params.index(p)}] if n > {params.index(p)} else (kwargs.get({p!r}) if kwargs else None)"
               for p in splits]  # fmt: skip
        lines += [f"    split_in = {got[0]}", f"    split_out = {got[1]}",
                  "    splits = None if split_in is None and split_out is None else (split_in, split_out)",
                  "    if splits is not None:", "        key = None"]  # fmt: skip
    lines.append(f"    call = ({', '.join((*names, 'splits') if splits else names)})")
    lines.append("    return key, call")
    return "\n".join(lines) + "\n"
