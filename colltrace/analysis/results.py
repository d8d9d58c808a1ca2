"""The typed results of a diagnosis: divergence, rank ends, evidence, cause, verdict (no text, no I/O)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeAlias

from colltrace.analysis.memory import RankMemory
from colltrace.analysis.schedules import Schedule
from colltrace.analysis.streams import Signature
from colltrace.analysis.vocab import Cause, Kind, Verdict
from colltrace.trace.events import Exit, Handling, SignalCaught, ThreadError
from colltrace.trace.records import Collective, Problem, RankState, Unread

if TYPE_CHECKING:
    from colltrace.analysis.timing import Timing


class Confidence(str, enum.Enum):
    HIGH = "high"  # two independent kinds of evidence agree, or one that cannot be read otherwise
    MEDIUM = "medium"  # one kind of evidence
    LOW = "low"  # a guess by elimination; said so in the report


class Clue(str, enum.Enum):
    """One kind of fact the diagnosis rests on (rendered to sentences by the report)."""

    HISTORY_DEVIATES = "history_deviates"  # the rank did something else at this point of its earlier steps
    HISTORY_CONSISTENT = "history_consistent"  # the rank did the same at this point of its earlier steps
    MAJORITY = "majority"  # the rank is in a minority of the group at this seq
    # the majority issued a collective new to each of them where the rest issued their usual one: their own
    # history cannot say whether the rest should have issued it too, so the majority decides
    FIRST_OF_KIND = "first_of_kind"
    # a transfer's sides disagree on its size in a step where another transfer's two sides both changed theirs
    # alike (the job's shapes changed): history cannot say which side should have changed (detail: none)
    SIZES_CHANGED = "sizes_changed"
    # ... or the side that kept its size issued another shape than at this point of its earlier steps (detail: none)
    SHAPE_CHANGED = "shape_changed"
    CRASHED = "crashed"  # the rank raised on its own (not inside a failing collective)
    OOM = "oom"  # the error says out of memory
    # what the rank's memory did: its growth, its peak, how near its limit it ended (detail: memory.RankMemory)
    MEMORY = "memory"
    OOM_KILLED = "oom_killed"  # its memory cgroup's OOM killer killed while the job ran (detail: how many)
    # the rank's DataLoader worker died of a signal (detail: its name, "Killed" for SIGKILL: the OOM killer's)
    WORKER_KILLED = "worker_killed"
    FATAL_SIGNAL = "fatal_signal"  # faulthandler wrote a fatal error outside any collective
    EXITED_CLEANLY = "exited_cleanly"  # the ranks exited cleanly as far on as the ranks waiting (detail: their steps)
    FINISHED_EARLY = "finished_early"  # the rank exited cleanly while others still waited for it
    STUCK_OUTSIDE = "stuck_outside"  # hung or killed with no collective in flight (detail: its RankEnd)
    IN_SPAN = "in_span"  # the rank was in this compute span when it stopped (detail: InSpan)
    OUT_OF_DATA = "out_of_data"  # the rank's DataLoader iterator raised StopIteration
    KILLED = "killed"  # stopped from outside with no collective in flight
    # the ranks were stopped by a terminating signal sent from outside at once (detail: StoppedTogether)
    STOPPED_TOGETHER = "stopped_together"
    WAITED_FOR = "waited_for"  # blocked ranks wait for this rank in the wait-for graph
    NO_TRACE = "no_trace"  # the rank left no trace file while the others waited
    NO_DUMP = "no_dump"  # the rank left no Flight Recorder dump (aborted in C++, killed) beside the others'
    CYCLE = "cycle"  # ranks wait on each other across groups
    MEMBERSHIP = "membership"  # the ranks disagree on the members of a group
    GROUP_CREATE = "group_create"  # the ranks asked new_group/split_group for different rank lists
    CREATION_MAJORITY = "creation_majority"  # the rank built a group with other members than most ranks' same call
    # the rank named a group otherwise than every other rank's same new_group/split_group call (detail: Relabeled)
    GROUP_LABEL = "group_label"
    # the rank issued what none of its positional peers (its place in the mesh's other replicas) issued at the
    # same seq, where its group's other members issued what theirs did (detail: Positional)
    POSITIONAL_PEERS = "positional_peers"
    # the rank of a cycle is blocked in a group of another dimension than most ranks are (detail: Entered)
    ENTERED_APART = "entered_apart"
    SAME_MODULE = "same_module"  # the mismatch is on the same module and op: the tensors themselves differ
    RECOMPUTE = "recompute"  # the divergent records are in activation-checkpoint recompute
    DDP_UNREDUCED = "ddp_unreduced"  # DDP raised: parameters got no gradient on the rank (detail: their indices)
    GRAD_REDUCTION = "grad_reduction"  # the divergent records are gradient reductions in backward
    # the culprit's gradient all-reduce changed size from its earlier steps, with no reduce-scatter on it: a
    # fixed buffer (DDP's bucket) whose reduction changed (detail: (the size before, the size now))
    GRAD_RESIZED = "grad_resized"
    # the culprit's previous call of the same line had the size the others issue now, and it loaded data between
    # the two: the size follows its data (detail: (the size then, the size now))
    DATA_RESIZED = "data_resized"
    # the culprit fetched a batch and began no backward before its next, in a step the others trained in
    # (detail: that step)
    SKIPPED_BATCH = "skipped_batch"
    GRAD_SKIPPED = "grad_skipped"  # the culprit completed the step the others wait in, without that reduction
    # the culprit ended the others' step with fewer gradient reductions: its next step's paired with the rest of
    # theirs (detail: that step)
    GRAD_SHORT = "grad_short"
    # the ranks gathered a unit again in backward where the others reduced gradients, every rank having gathered it
    # for its forward: it needs gradients on their side only (detail: the unit)
    GRADS_APART = "grads_apart"
    EVAL_FORWARD = "eval_forward"  # the culprit ran a forward without gradients / in eval mode (detail: mode)
    REPEATED_MODULE = "repeated_module"  # the culprit gathered a module more often than in its earlier steps
    # the culprit issued records inside torch's Join (it ran out of inputs, shadowing the others' collectives)
    # before the divergence, the others none (detail: the first such seq)
    JOINED = "joined"
    LEFT_LOOP = "left_loop"  # the culprit stopped issuing training-step collectives at a step boundary
    TIMED_OUT = "timed_out"  # the victims' collectives failed (timeout, peer gone)
    LAST_ARRIVER = "last_arriver"  # the rank arrived last at most collectives, by a wide margin
    SLOW_IN = "slow_in"  # the rank spends more per step than the median rank in one category (detail: SlowIn)
    TURNED_SLOW = "turned_slow"  # the rank became late at a later step (detail: the step)
    STEP_BOUNDARY = "step_boundary"  # the victims were starting a new step the culprit never started
    STEP_SKEW = "step_skew"  # the same collective issued in another step/micro-step (detail: StepSkew)
    SKEW_BEFORE = "skew_before"  # before the divergence, the rank issued one seq at another micro-step (detail: StepSkew with its seq)
    COUNT_CHANGED = "count_changed"  # the rank issued another number of collectives in this step than in the one before
    SPLITS = "splits"  # the rank's all-to-all split sizes disagree with its peers' (detail: the peers)
    FIRST_FAILED = "first_failed"  # the rank's collective failed first, with an error of its own (not a lost peer)
    # the rank's call raised an error of its own in Python (an argument check), before any other rank failed
    # (detail: its type)
    REFUSED_CALL = "refused_call"
    # every rank raised the same error, and the error names the ranks it came from (detail: its type)
    NAMED_BY_ERROR = "named_by_error"
    # a monitored_barrier raised on another rank naming this one as not passing it in time (detail: who raised it)
    MISSED_BARRIER = "missed_barrier"
    # the rank died of its own error inside its record at the divergence: what the disagreement did (detail: type)
    FAILED_IN_IT = "failed_in_it"
    MISDIRECTED = "misdirected"  # the rank sent one peer more than it received, another fewer (detail: PeersApart)
    WRONG_SOURCE = "wrong_source"  # the rank waits to receive from a peer that sent nothing, another's unheard
    # the rank reached the collective the others were blocked in only after they had failed in it (timed out):
    # it is what they waited for (detail: the ranks that gave up)
    ARRIVED_AFTER = "arrived_after"
    ROOT_APART = "root_apart"  # the same collective from the same line, another root (detail: (its, theirs))
    HANDLING = "handling"  # the culprit issued it while handling its own exception (detail: events.Handling)
    SIGNALLED = "signalled"  # it caught a signal it handles itself, none of the others did (events.SignalCaught)
    # the ranks waited in the c10d store for a key (Store.wait/get) from before the culprits went on to a
    # collective or out of the job: what they waited for never came (detail: InSpan of the store span)
    STORE_WAIT = "store_wait"
    GROUP_APART = "group_apart"  # issued from the line the others issue in another group it is in (GroupApart)
    EXITED = "exited"  # torchrun found it ended so first, before it stopped the others (detail: events.Exit)
    # killed from outside first (SIGKILL) while it waited in a collective for ranks that had neither failed nor
    # timed out, which torchrun stopped after it (detail: those ranks)
    KILLED_WAITING = "killed_waiting"
    # stopped without an end record (SIGKILL, a node lost), in a collective or not, before the others, whose
    # errors say a peer closed its connection: the dead went first, the others noticed (detail: those others)
    DIED_FIRST = "died_first"
    # stopped in a framework's call that waits for every worker outside torch.distributed (Ray Train's report),
    # while the others wait in a collective: each waits for the other (detail: the call, "ray.train.report")
    WORKER_SYNC = "worker_sync"
    # the rank issued its divergent record from a thread other than its training loop's, where the others issued
    # theirs from their loops (a background thread's collective on the group)
    OTHER_THREAD = "other_thread"
    THREAD_DIED = "thread_died"  # a thread of the rank's own died of an exception (detail: events.ThreadError)
    OUTLIVED = "outlived"  # a rank still in the collective, not failed, long after the others timed out there
    LATE_IN = "late_in"  # the compute span a rank that arrived last spent most of its lateness in (detail: InSpan)
    # the rank went past, this step, a collective of the group others of the cycle wait in, which it issued in
    # its step before (detail: the group's label)
    WENT_PAST = "went_past"
    # the rank went on past the collective the others wait in after going through the groups in the order they did
    # over its last collectives: it left that order on a branch of its own (detail: the group's label)
    LEFT_ORDER = "left_order"
    # the rank is blocked in a collective new to it, issued from the line where others of the cycle wait in
    # another group: the same statement reached the groups in another order (detail: the others' group label)
    SAME_LINE = "same_line"
    SAME_ORDER = "same_order"  # the ranks of a cycle each block in a blocking transfer of one kind (detail: send|recv)
    SAVED_APART = "saved_apart"  # the rank saved a checkpoint in this step, the others did not (detail: how)
    OTHER_CALL = "other_call"  # the ranks issued it from different lines or with different reduce ops
    SCHEDULE = "schedule"  # the pipeline schedules differ (detail: SchedulesApart)
    EVERY_PAIR = "every_pair"  # the rank is an end of every pair whose transfers disagree (detail: the pairs)
    NEW_SIZE = "new_size"  # the rank sent or received a size new to it; its peer one it had before (detail: peer)
    # at a dtype divergence, the rank issued another dtype than at this point of its earlier steps while the
    # others kept theirs (detail: DtypeChange)
    DTYPE_CHANGED = "dtype_changed"
    ODD_DTYPE = "odd_dtype"  # the rank's dtype is in no other record of the job (detail: the ranks whose dtype is)
    # the ranks, blocked in a group's collective the others of a cycle never issued, had issued every earlier
    # collective of that group at another (step, micro-step) than those others (detail: StepSkew with its seq)
    PAIRED_APART = "paired_apart"
    # the rank issued it from a line of code that had issued no collective on it before: something it never did
    NEW_LINE = "new_line"
    # the rank issued exactly (op, size, module, phase, line) a record of its previous step again (detail: that step)
    REPEATS_STEP = "repeats_step"
    UNDECIDED = "undecided"  # the evidence does not separate the ranks


@dataclass(frozen=True, slots=True)
class StepSkew:
    """STEP_SKEW, SKEW_BEFORE: the (step, micro-step) a culprit issued a collective in, and the others'."""

    step: int
    micro: int
    other_step: int
    other_micro: int
    seq: int | None = None  # SKEW_BEFORE: the earlier seq where they issued it apart


@dataclass(frozen=True, slots=True)
class InSpan:
    """IN_SPAN: the compute span the rank was in when it stopped."""

    kind: str  # the span's kind as recorded: data, forward, backward, recompute, optimizer, checkpoint, phase
    for_s: float | None  # how long it had been open, None when not known
    module: str  # the module it ran, "" none
    flavour: str = ""  # how it was entered (torch.load, dcp.save), "" none


@dataclass(frozen=True, slots=True)
class Lateness:
    """LAST_ARRIVER: how often the rank arrived last, and how long the others waited for it alone."""

    waited_s: float
    last_arrivals: int
    collectives: int


@dataclass(frozen=True, slots=True)
class SlowIn:
    """SLOW_IN: the breakdown category the rank's extra time per step goes to, and how much."""

    category: str  # a timing category: data, forward, allgather_wait, ...
    extra_ns: float  # more per step than the median rank


@dataclass(frozen=True, slots=True)
class SplitGap:
    """SPLITS: one pair of an all-to-all whose split sizes disagree."""

    sender: int
    receiver: int
    sent: int  # rows the sender sent the receiver
    expected: int  # rows the receiver expected from it
    rows: bool = True  # False: sent and expected count elements (the two ranks' rows are not as long)


@dataclass(frozen=True, slots=True)
class PeersApart:
    """MISDIRECTED, WRONG_SOURCE: the peers a rank's transfers went wrong with."""

    over: tuple[int, ...]  # sent one transfer more than they received / waited on for one they never sent
    under: tuple[int, ...]  # sent one fewer than they wait for / whose transfer to it waits unreceived


@dataclass(frozen=True, slots=True)
class Positional:
    """POSITIONAL_PEERS: the dimension, the culprits' peers (who issued otherwise than the culprits) and the other
    members' peers (who issued as those members did)."""

    label: str  # the dimension's label (mesh_tp)
    against: tuple[int, ...]
    backing: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Entered:
    """ENTERED_APART: the group label the rank is blocked in, the one most ranks are blocked in, and how many."""

    theirs: str
    usual: str
    agree: int


@dataclass(frozen=True, slots=True)
class Relabeled:
    """GROUP_LABEL: the group_desc the rank passed, and the one the other ranks passed in the same call."""

    theirs: str
    usual: str


@dataclass(frozen=True, slots=True)
class GroupApart:
    """GROUP_APART: the group the others issue the culprit's divergent call in, from the same line."""

    group: str  # its label
    line: str  # the user's line both come from
    waiting: tuple[int, ...]  # the ranks blocked there on it


@dataclass(frozen=True, slots=True)
class DtypeChange:
    """DTYPE_CHANGED: the dtype the culprits issued at this point of their earlier steps, the one they issued
    now, and the ranks that kept theirs."""

    was: str
    now: str
    kept: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class StoppedTogether:
    """STOPPED_TOGETHER: the signal, how far apart the ranks got it, and how long before the first the job's
    last record was made (its last sign of progress)."""

    signal: str
    spread_s: float
    since_s: float | None  # None: no record before it


@dataclass(frozen=True, slots=True)
class SchedulesApart:
    """SCHEDULE: the schedule the odd stages built, and the one the others did."""

    theirs: Schedule
    usual: Schedule


# what a clue refers to, by clue: a name from the trace (module, error type, label, activity, send|recv,
# checkpoint flavour), a number (ranks that agree, steps, a step), ranks (who were blocked, the peers),
# rank pairs (EVERY_PAIR), a group's asked members (CREATION_MAJORITY), or one of the small types above


@dataclass(frozen=True, slots=True)
class Evidence:
    clue: Clue
    ranks: tuple[int, ...]
    detail: Detail = None  # what the clue refers to, as values (never a sentence): see Detail


class Blind(str, enum.Enum):
    """One kind of thing the traces could not show (rendered to sentences by the report)."""

    NO_TRACE = "no_trace"  # the rank left no trace file
    NO_DUMP = "no_dump"  # the rank left no Flight Recorder dump
    FR_UNATTRIBUTED = "fr_unattributed"  # Flight Recorder dumps hold no module, phase, step, spans, nor rank ends
    FR_NO_MEMBERS = "fr_no_members"  # the dumps do not list every group's members
    UNREADABLE = "unreadable"  # the reader could not read a rank's file (text: the reader's reason)
    DUMP_UNREADABLE = "dump_unreadable"  # nor the Flight Recorder dump beside its trace (text: the reason)
    NO_STACKS = "no_stacks"  # a running rank did not answer a request for its stacks in time
    UNTRACED_API = "untraced_api"  # this torch has an API the recorder does not trace (text: it, in its words)
    RING_EMPTY = "ring_empty"  # the ring file is empty or cut before its header
    RING_CUT = "ring_cut"  # the ring file is cut short (count: the slots it holds)
    RING_WRAPPED = "ring_wrapped"  # the ring kept the last records only (count: those overwritten)
    TORN_LINES = "torn_lines"  # unreadable sidecar lines (count)
    RECORDING_FAILED = "recording_failed"  # the writer gave up on the rank (text: its reason)
    SKIPPED_EVENTS = "skipped_events"  # sidecar events with a missing or wrong-typed field, left out (count)


@dataclass(frozen=True, slots=True)
class Unseen:
    """One thing the traces could not show."""

    what: Blind
    rank: int | None = None  # the rank it concerns, None for the run
    count: int = 0  # slots, records, lines or events, as `what` says
    text: str = ""  # the trace's or the reader's own words (a reason), never a sentence of ours

    @classmethod
    def of_problem(cls, p: Problem) -> Unseen:
        return cls(_UNREAD[p.what], p.rank, text=p.reason)


_UNREAD = {Unread.TRACE: Blind.UNREADABLE, Unread.DUMP: Blind.DUMP_UNREADABLE, Unread.STACKS: Blind.NO_STACKS}


@dataclass(frozen=True, slots=True)
class AtSeq:
    """What one rank did at the divergent (group, seq): its signature, or None if it never issued it."""

    rank: int
    sig: Signature | None
    step: int | None
    idx: int  # record number on that rank, -1 if none
    visible: bool = True  # False: the rank's trace cannot say (no file, ring dropped that far)


@dataclass(frozen=True, slots=True)
class Divergence:
    """The first (group, seq) where the ranks disagree."""

    group: str  # group name as recorded
    label: str  # desc such as default_pg, else the name
    group_ranks: tuple[int, ...]
    seq: int | None
    kind: Kind
    at: tuple[AtSeq, ...]  # one per member rank, rank order
    classes: tuple[tuple[int, ...], ...]  # ranks grouped by identical records (missing ones together)


@dataclass(frozen=True, slots=True)
class RankEnd:
    """How one rank ended, and what it was doing."""

    rank: int
    state: RankState
    last: Collective | None  # last collective it issued
    blocked: Collective | None  # the collective it was stuck in (in flight or failed), if any
    error_type: str
    error_message: str
    collective_failure: bool  # its error came out of a collective (timeout, peer gone): a victim's error
    oom: bool
    stack: tuple[str, ...]  # a few innermost frames, "file:line in func: code"
    host: str
    steps: int
    signal: str = ""  # the terminating signal it recorded (alive, then stopped from outside), if any
    open_span: Collective | None = None  # the innermost compute span still open when it stopped
    open_for_s: float | None = None  # how long that span had been open at the run's last sign of life
    out_of_data: bool = False  # a DataLoader iterator of this rank raised StopIteration
    out_of_data_at: int | None = None  # the step of its last StopIteration (each epoch ends with one)
    alive: bool = False  # its process is still running (the job is live)
    error_t_ns: int = 0  # when its error was recorded (wall-clock ns), 0 if none
    lost_peer: bool = False  # its error says it waited for a peer or lost one (a timeout, a closed connection)
    idle_s: float | None = None  # its watchdog saw no progress for this long (a live run), None: no such stack
    usual_s: float | None = None  # ... against the job's usual wait
    exit: Exit | None = None  # how torchrun saw it end, where it failed and torchrun said
    # the framework call outside torch.distributed its last stack waits in for every worker ("ray.train.report")
    worker_sync: str = ""
    # the job's other threads at its last stacks that were running its own code (an uploader, a producer): what
    # a loop waiting on a lock, a queue or a join waits for. (name, frames as `stack`)
    threads: tuple[tuple[str, tuple[str, ...]], ...] = ()


Detail: TypeAlias = (
    str | int | tuple[int, ...] | tuple[tuple[int, ...], ...] | tuple[SplitGap, ...]
    | StepSkew | InSpan | Lateness | SlowIn | SchedulesApart | PeersApart | DtypeChange | RankEnd | Handling | ThreadError
    | SignalCaught | Exit | GroupApart | Positional | Relabeled | Entered | RankMemory | StoppedTogether
    | None
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Finding:
    cause: Cause
    confidence: Confidence
    evidence: tuple[Evidence, ...]
    rule: str = ""  # the cause rule that named it (causes.RULES)


@dataclass(frozen=True, slots=True)
class ContextRow:
    """One seq of the divergent group around the divergence: what each rank issued there."""

    seq: int
    sigs: tuple[Signature | None, ...]  # one per rank of Divergence.at, same order


@dataclass(frozen=True, slots=True)
class Diagnosis:
    verdict: Verdict
    culprits: tuple[int, ...]
    victims: tuple[int, ...]
    divergence: Divergence | None
    cycle: tuple[int, ...] | None
    finding: Finding | None  # None when healthy and nothing to say
    ranks: dict[int, RankEnd]
    unseen: tuple[Unseen, ...]  # what the traces could not show (missing files, dropped records, torn slots)
    context: tuple[ContextRow, ...] = ()  # a few seqs before and at the divergence
    timing: Timing | None = None  # where each rank's time went: steps, overlap, stragglers, clocks
    # where the divergent collective was issued: (ranks, "file:line in func") per class of ranks that issued it
    call_sites: tuple[tuple[tuple[int, ...], str], ...] = ()
    window: int | None = None  # the last records per rank the alignment read (None: all the trace holds)
    blame_rule: str = ""  # the blame rule that named the culprits (culprit.BLAME_RULES), "" when healthy
    memory: dict[int, RankMemory] = field(default_factory=dict)  # each rank's memory, where it was sampled
