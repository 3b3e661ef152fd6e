"""Order, length, epochs and resumable state of ferry.torch's datasets (_StreamState), and
global_state() for a DataLoader's state_dict."""
from __future__ import annotations


from torch.utils.data import get_worker_info

from .order import Layout as _Layout, epoch_order

_STATE_TAG = "ferry.torch.ArrayDataset"
_STATE_VERSION = 1


class InaccurateStateWarning(UserWarning):
    """state_dict() was asked where the dataset cannot know the exact position."""


# --------------------------------------------------------------------------------------------
# StatefulDataLoader states -> one global state
# --------------------------------------------------------------------------------------------
def _find_states(obj, out):
    if isinstance(obj, dict):
        if str(obj.get("_tag", "")).startswith("ferry.torch."):
            out.append(obj)
            return
        for v in obj.values():
            _find_states(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _find_states(v, out)


def global_state(loader_state):
    """A global ArrayDataset state from a StatefulDataLoader.state_dict() (any number of
    workers): load it with ArrayDataset.load_state_dict() to resume with any number of ranks or
    workers. With several ranks, any one rank's loader state will do."""
    states = []
    _find_states(loader_state, states)
    if not states:
        raise ValueError("global_state: no ArrayDataset state in this state dict")
    workers = [s for s in states if s.get("worker")]
    if not workers:
        return max(states, key=lambda s: (s["epoch"], s["samples_consumed"]))
    # the DataLoader hands batches over in order, so the furthest worker marks the global position
    epoch = max(s["worker"]["epoch"] for s in workers)
    cur = [s for s in workers if s["worker"]["epoch"] == epoch]
    base = dict(cur[0])
    base.pop("worker", None)
    n = int(base["num_samples"])
    w = cur[0]["worker"]
    count = w.get("count", n)           # this rank's units in the pass
    if len(cur) == w["num_workers"] and all(s["worker"]["ended"] for s in cur):
        steps = count                   # every unit of this rank's pass was delivered
    else:
        steps = 0
        for s in cur:
            ws = s["worker"]
            if ws["taken"] > 0:
                steps = max(steps, ws["id"] + (ws["taken"] - 1) * ws["num_workers"] + 1)
    consumed = min(n, w["start"] + steps * w["world_size"] * w["batch"])
    # the epoch is complete at n, or after the last full step when the tail is dropped; a rank
    # whose share of an uneven tail is empty has delivered all it has one step earlier, while
    # the other ranks still take the tail: its position is where every rank has taken `steps`
    if consumed >= n or (base.get("drop_last") and steps >= count):
        base.update(epoch=epoch + 1, samples_consumed=0)
    else:
        base.update(epoch=epoch, samples_consumed=consumed)
    return base


class _StreamState:
    """Order, length, epochs and the resumable state (torchdata's Stateful) of a
    _BatchStream."""

    # ---------------------------------------------------------------- order and length
    def _order(self, epoch):
        key = (self.num_samples, self.seed, epoch, self.shuffle, self.block_size)
        c = self._order_cache
        if c is None or c[0] != key:
            c = self._order_cache = (key, self._make_order(epoch))
        return c[1]

    def _epoch_of_order(self, order):
        """The epoch whose order this is (a group's random draws are per epoch: XarrayDataset's
        patches, ImageDataset's crops): the cached order's. The next pass's groups, read ahead,
        cache their own order; by then this pass submits no more groups."""
        c = self._order_cache
        return c[0][2] if c is not None and c[1] is order else self._epoch

    def _make_order(self, epoch):
        return epoch_order(self.num_samples, self.seed, epoch, self.shuffle, self.block_size)

    def __len__(self):
        """Batches (samples when batch_size is None) this rank yields in a whole epoch."""
        rank, world = self._dist()
        return _Layout(self.num_samples, 0, world, rank, self.batch_size or 1, self.drop_last).count

    def set_epoch(self, epoch):
        """Select the epoch (its order). A different epoch starts at its beginning; the current
        epoch keeps its position (so set_epoch after load_state_dict resumes mid-epoch)."""
        epoch = int(epoch)
        self._sync_from_workers()
        if epoch != self._epoch or self._pass_over:   # a finished pass has no position left
            self._epoch, self._consumed, self._resume = epoch, 0, None
            self._pass_over = False
            if get_worker_info() is None:      # the board is the main process's to publish
                self._board.publish(self._epoch, self._consumed)

    @property
    def epoch(self):
        """The epoch of the latest pass (counting passes run by DataLoader workers)."""
        if get_worker_info() is None:
            lt = self._board.latest()
            if lt is not None:
                return lt[0]
        return self._epoch

    def _sync_from_workers(self):
        """In the main process, after DataLoader worker passes: adopt the epoch they reached
        (the next pass is the next epoch)."""
        if get_worker_info() is not None:
            return
        lt = self._board.latest()
        if lt is not None:
            self._epoch, self._consumed, self._resume = lt[0] + 1, 0, None
            self._pass_over = False
            self._board.publish(self._epoch, 0)

    # ---------------------------------------------------------------- state (torchdata Stateful)
    def state_dict(self):
        """The global position: {"epoch", "samples_consumed", "seed", ...} — identical on every
        rank, valid for any world size. Inside DataLoader workers (StatefulDataLoader) each
        worker's state also carries "worker", for an exact resume with the same layout;
        global_state() turns a StatefulDataLoader state into a global one.

        In the main process of a plain DataLoader with workers the dataset cannot see which
        batches the loader delivered: state_dict() then warns and reports the start of the
        workers' latest pass — never ahead of what was delivered (a worker that has produced
        its last batch may still have batches waiting in the loader's queues)."""
        epoch, consumed = self._epoch, int(self._consumed)
        if get_worker_info() is None and self._worker_progress is None:
            lt = self._board.latest()
            if lt is not None:
                epoch, consumed, _ = lt
                import warnings
                warnings.warn(
                    f"ferry.torch.{type(self).__name__}.state_dict(): this dataset is iterated by "
                    f"DataLoader worker processes, and the main process cannot see which batches "
                    f"the loader delivered; the state is the start of the workers' latest pass "
                    f"(epoch {epoch}, sample {consumed}), so a resume from it repeats what that "
                    f"pass delivered. "
                    f"For an exact resume use torchdata's StatefulDataLoader and "
                    f"ferry.torch.global_state(loader.state_dict()), or num_workers=0.",
                    InaccurateStateWarning, stacklevel=2)
        st = {
            "_tag": self._STATE_TAG, "version": _STATE_VERSION,
            "epoch": epoch, "samples_consumed": consumed,
            "seed": self.seed, "shuffle": self.shuffle, "block_size": self.block_size,
            "num_samples": self.num_samples, "batch_size": self.batch_size,
            "drop_last": self.drop_last,
        }
        if self._worker_progress is not None:
            st["worker"] = dict(self._worker_progress)
        return st

    def load_state_dict(self, state):
        cls = type(self).__name__
        if not isinstance(state, dict) or state.get("_tag") != self._STATE_TAG:
            raise ValueError(f"{cls}.load_state_dict: not a state saved by {cls}.state_dict()")
        if int(state["num_samples"]) != self.num_samples:
            raise ValueError(f"{cls}.load_state_dict: the state is for {state['num_samples']} "
                             f"samples, this dataset has {self.num_samples}")
        self.seed = int(state["seed"])
        self.shuffle = bool(state["shuffle"])
        self.block_size = state["block_size"]
        self._epoch = int(state["epoch"])
        self._consumed = int(state["samples_consumed"])
        self._resume = dict(state["worker"]) if state.get("worker") else None
        self._pass_over = False
        self._worker_progress = None
        self._order_cache = None
        if get_worker_info() is None:
            self._board.publish(self._epoch, self._consumed)

    def _check_loader(self, found):
        """A DataLoader that batches our batches again (DataLoader(ds) has batch_size=1) would
        silently give (1, B, ...): refuse it. Per-sample mode (batch_size=None) is meant for it."""
        if found is None or not found[0] or self.batch_size is None:
            return
        from torch.utils.data._utils.collate import default_collate
        collate = found[1]
        if collate is None or collate is default_collate:
            raise TypeError(
                f"ferry.torch.{type(self).__name__} already yields batches of {self.batch_size}; "
                f"a DataLoader with automatic batching (DataLoader's default batch_size=1) would "
                f"stack them again into (1, {self.batch_size}, ...). Use "
                f"DataLoader(ds, batch_size=None), or batch_size=None on the dataset to let the "
                f"DataLoader batch single samples.")
        import warnings
        warnings.warn(f"ferry.torch.{type(self).__name__}: the DataLoader batches this dataset's "
                      f"batches (of {self.batch_size}) again with its collate_fn; pass "
                      f"batch_size=None to the DataLoader unless that is meant", stacklevel=3)
