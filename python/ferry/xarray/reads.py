"""Reading a FerryStore's variables (_StoreReads): plans of the chunks a selection touches, the
reads h5py or zarr-python make for what the engine cannot, decoding on the device, and one plan
for a whole Dataset.load()."""
from __future__ import annotations

import contextlib
import os

import numpy as np
from xarray.core import indexing

import ferry
from ferry import _ferry
from .array import _find_backend, _loading_dataset
from .common import _VarSpec, _apply_post, _key_triples, _norm_key
from .hdf5 import _h5_error


class _StoreReads:
    """Reading a FerryStore's variables: plans of the chunks a selection touches, the reads
    h5py or zarr-python make for what the engine cannot, decoding on the device, and one plan
    for a whole Dataset.load()."""

    # -- reading -------------------------------------------------------------
    def _alloc(self, shape, dtype: np.dtype, device: int):
        if device < 0:
            if dtype.kind == "O":
                return np.empty(shape, dtype=dtype)
            a = ferry.empty(shape, dtype, "cpu", ctx=self.ctx)
            return np.asarray(a).view(dtype)
        import cupy
        with ferry._nogpu.device_alloc(self.filename, device, self.ctx), cupy.cuda.Device(device):
            return cupy.empty(shape, dtype=dtype)

    def _add(self, plan, s: _VarSpec, key: tuple):
        """Add the read of `key` (OUTER backend key) of s to plan; return a
        finisher giving the array once the plan ran."""
        triples, post = _key_triples(key, s.shape)
        counts = tuple(max(0, (b - a + st - 1) // st) for a, b, st in triples)
        if s.kind in ("h5py", "zarrpy", "unsupported", "strings"):
            with self._user_lock if self._user_lock is not None else contextlib.nullcontext():
                return self._direct(s, triples, counts, post)
        out = self._alloc(counts, s.dtype, s.device)
        if out.size:
            self._plan_triples(plan, s, triples, out)

        def finish():
            r = _apply_post(out, post)
            return self._decode(s, r)
        return finish

    def _plan_triples(self, plan, s: _VarSpec, triples, dst):
        plan.read(s.source, s.index if s.index is not None else s.name, dst, triples if s.shape else None, True)

    def _row_source(self, s: _VarSpec):
        """s as a source of Plan.read_rows (the reads _plan_triples makes, row by row in one call)."""
        return (s.source, s.index if s.index is not None else s.name)

    def _plan_into(self, plan, s: _VarSpec, key: tuple, dst):
        """Plan the raw read (stored values, native byte order, C order, no CF decoding) of
        `key` — slices only — of s into dst: an array or a (ptr, nbytes, device) tuple of
        exactly the selection's bytes. For ferry.torch.XarrayDataset, which decodes on its own
        device."""
        if s.kind != "ferry":
            raise ferry.FerryError(_ferry.EUNSUPPORTED, s.error or f"{self.filename}: variable {s.name}: "
                                   f"read by {s.kind}, not by ferry's engine")
        triples, post = _key_triples(key, s.shape)
        if post is not None:
            raise ValueError("_plan_into takes slices only")
        self._plan_triples(plan, s, triples, dst)

    def _direct(self, s: _VarSpec, triples, counts, post):
        sl = tuple(slice(a, b, st) for a, b, st in triples)
        if s.kind == "h5py":
            import h5py
            try:
                if h5py.check_dtype(vlen=s.source.dtype) is str:
                    data = s.source.asstr()[sl] if s.shape else s.source.asstr()[()]
                    data = np.asarray(data, dtype=object)
                else:
                    data = s.source[sl] if s.shape else s.source[()]
                    data = np.asarray(data)
                    if data.dtype != s.dtype:
                        data = data.astype(s.dtype)
            except MemoryError:
                raise
            except Exception as e:  # noqa: BLE001 — h5py's errors on damaged data
                raise _h5_error(self.filename, f"variable {s.name}", e) from None
        elif s.kind == "strings":
            # the C library's read, at once: references by a plan, then the heap (one list of str)
            got = s.source.read_strings(s.index, triples if s.shape else None, threads=self.threads)
            data = np.empty(len(got), dtype=object)
            data[:] = got
            data = data.reshape(counts)
        elif s.kind == "zarrpy":
            arr = s.source if not isinstance(s.source, ferry.Dataset) else None
            if arr is None:
                import zarr
                g = (self.group or "").strip("/")
                arr = zarr.open_array(store=self.filename, path=f"{g}/{s.name}" if g else s.name, mode="r")
            data = np.asarray(arr[sl] if s.shape else arr[()])
            if s.dtype.kind == "O" and data.dtype != s.dtype:
                data = data.astype(s.dtype)
        else:
            raise ferry.FerryError(_ferry.EUNSUPPORTED,
                                   s.error or f"{self.filename}: variable {s.name}: unsupported type")

        def finish():
            r = _apply_post(data, post)
            if s.device >= 0:
                import cupy
                with cupy.cuda.Device(s.device):
                    r = cupy.asarray(r)
            return self._decode(s, r)
        return finish

    def _decode(self, s: _VarSpec, arr):
        if not s.gpu_decode:
            return arr
        from xarray.coding import variables as cv
        for f in s.gpu_decode:
            fn = getattr(f, "func", None)
            kw = getattr(f, "keywords", {}) or {}
            if fn is cv._apply_mask:
                arr = _device_apply_mask(arr, **kw)
            elif fn is np.asarray:
                arr = arr.view(np.dtype(kw["dtype"])) if arr.dtype.itemsize == np.dtype(kw["dtype"]).itemsize \
                    else arr.astype(kw["dtype"])
            else:
                arr = f(arr)
        return arr

    def run(self, plan):
        if len(plan):
            # before and after: a replace or an in-place write of the file in between
            # would pair this metadata with other bytes; the reader sees an error instead
            with self._user_lock if self._user_lock is not None else contextlib.nullcontext():
                self._check_unchanged()
                try:
                    self.ctx.run(plan, path=self.path_policy, threads=self.threads, decode=self.decode)
                except ferry.FerryError as e:
                    if not self._alias:
                        raise
                    raise ferry.FerryError(e.code, str(e).replace(self._alias, self.filename)) from None
                self._check_unchanged()

    def read(self, name, key: tuple):
        s = self.spec(name)
        ck = (s.name, _norm_key(key))
        with self._lock:
            hit = self._cache.pop(ck, None)
        if hit is not None:
            return hit
        self._maybe_batch(s, key)
        with self._lock:
            hit = self._cache.pop(ck, None)
        if hit is not None:
            return hit
        plan = ferry.Plan()
        fin = self._add(plan, s, key)
        self.run(plan)
        return fin()

    def read_many(self, requests: list) -> list:
        """[(variable name, key)] -> arrays, with ONE plan (progress=: about 20, reported)."""
        self._live()
        if getattr(self, "progress", None):
            return self._read_many_reported(requests)
        plan = ferry.Plan()
        fins = [self._add(plan, self.specs[n], k) for n, k in requests]
        self.run(plan)
        return [f() for f in fins]

    def _read_many_reported(self, requests: list) -> list:
        """read_many as about _progress.STEPS plans of whole variables' reads, run one after
        another with a report after each (the engine reports a plan's end, not its bytes)."""
        sizes = [int(np.prod([max(0, (b - a + st - 1) // st) for a, b, st in _key_triples(k, self.specs[n].shape)[0]]))
                 * self.specs[n].dtype.itemsize for n, k in requests]
        total = sum(sizes)
        report = ferry._progress.reporter(self.progress, f"load {os.path.basename(self.filename)}", total,
                                          where="ferry.xarray")
        report(0)
        fins, plan, done, in_plan = [], ferry.Plan(), 0, 0
        for i, ((n, k), size) in enumerate(zip(requests, sizes)):
            fins.append(self._add(plan, self.specs[n], k))
            in_plan += size
            if in_plan >= max(1, total // ferry._progress.STEPS) or i == len(requests) - 1:
                self.run(plan)
                done += in_plan
                report(done)
                plan, in_plan = ferry.Plan(), 0
        return [f() for f in fins]

    # -- batching Dataset.load() ---------------------------------------------
    def _maybe_batch(self, s: _VarSpec, key: tuple):
        ds = _loading_dataset()
        if ds is None:
            return
        reqs = []
        seen = set()
        for v in ds.variables.values():
            found = _find_backend(v._data)
            if found is None:
                continue
            arr, lkey = found
            if arr.store is not self:
                continue
            try:
                bk, _ = indexing.decompose_indexer(lkey, arr.shape, indexing.IndexingSupport.OUTER)
            except Exception:  # noqa: BLE001 — anything unusual: read it on its own later
                continue
            ck = (arr.name, _norm_key(bk.tuple))
            if ck in seen:
                continue
            seen.add(ck)
            reqs.append((arr.name, bk.tuple, ck))
        if len(reqs) < 2:
            return
        results = self.read_many([(sp, k) for sp, k, _ in reqs])
        with self._lock:
            for (_, _, ck), r in zip(reqs, results):
                self._cache[ck] = r


def _device_apply_mask(data, encoded_fill_values, decoded_fill_value, dtype):
    """xarray.coding.variables._apply_mask for device (cupy) arrays."""
    data = data.astype(dtype, copy=True)
    if encoded_fill_values:
        cond = None
        for fv in encoded_fill_values:
            c = data == fv
            cond = c if cond is None else (cond | c)
        data[cond] = decoded_fill_value
    return data
