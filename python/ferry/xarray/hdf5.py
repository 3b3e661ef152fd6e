"""netCDF-4 / HDF5 through h5py: metadata, attributes, dimensions and chunk tables, turned into
the extents ferry's engine reads (_H5Source), and every h5py error into a FerryError naming
the file and object."""
from __future__ import annotations

import os
import threading

import numpy as np

import ferry
from ferry import _ferry
from .common import _VarSpec, _native, log
from .common import _file_identity


_H5_HIDDEN = {"CLASS", "DIMENSION_LIST", "NAME", "REFERENCE_LIST", "_Netcdf4Dimid", "_Netcdf4Coordinates",
              "_nc3_strict", "_NCProperties", "_SuperblockVersion", "_IsNetcdf4"}


_NC_DIM_ONLY = b"This is a netCDF dimension but not a netCDF variable"


_NON_COORD = "_nc4_non_coord_"


# ---------------------------------------------------------------------------
# HDF5 / netCDF-4 through h5py
# ---------------------------------------------------------------------------
def _h5_attr_value(v):
    import h5py
    if isinstance(v, h5py.Empty):
        return "" if v.dtype.kind == "S" else None
    if isinstance(v, (bytes, np.bytes_)):
        try:
            return bytes(v).decode("utf-8")
        except UnicodeDecodeError:
            return bytes(v)
    if isinstance(v, np.ndarray):
        if v.dtype.kind == "S":
            vals = [bytes(x).decode("utf-8", "replace") for x in v.ravel()]
            return vals[0] if len(vals) == 1 else vals
        if v.dtype.kind == "O":
            vals = [x.decode("utf-8") if isinstance(x, bytes) else x for x in v.ravel()]
            return vals[0] if len(vals) == 1 else vals
        if v.ndim == 1 and v.shape[0] == 1:
            return v[0]
        if v.ndim == 0:
            return v[()]
    return v


def _h5_attrs(obj) -> dict:
    out = {}
    for k in obj.attrs.keys():
        if k in _H5_HIDDEN:
            continue
        try:
            v = obj.attrs[k]
        except Exception as e:  # noqa: BLE001 — netCDF4 and h5netcdf refuse it too
            raise _h5_error(obj.file.filename, f"{obj.name}: attribute {k!r}", e) from None
        v = _h5_attr_value(v)
        if v is None:
            continue
        out[k] = v
    return out


class _H5Source:
    """Layout of one HDF5 dataset as ferry needs it."""

    def __init__(self, path, dset, dtype: np.dtype):
        import h5py
        self.path = path
        self.dset = dset
        self.stored = dset.dtype
        self.itemsize = dtype.itemsize
        self.swap = self.stored.byteorder == ">" and self.stored.itemsize > 1
        self.swap_size = self.stored.itemsize // 2 if self.stored.kind == "c" else self.stored.itemsize
        self.shape = tuple(dset.shape)
        dcpl = dset.id.get_create_plist()
        self.layout = dcpl.get_layout()
        self.filters = []
        self.supported = True
        self.why = ""
        for i in range(dcpl.get_nfilters()):
            code, flags, vals, name = dcpl.get_filter(i)
            codec = _ferry.hdf5_filter_codec(code, vals, self.stored.itemsize)   # C's table of HDF5 filters
            if codec is not None:
                self.filters.append(codec)
            else:
                self.supported = False
                self.why = f"HDF5 filter {code} ({name.decode(errors='replace') if isinstance(name, bytes) else name})"
        try:
            if dcpl.get_external_count() > 0:
                self.supported = False
                self.why = "external storage"
        except AttributeError:
            pass
        if self.layout == h5py.h5d.COMPACT:
            self.supported, self.why = False, "compact layout"
        elif self.layout not in (h5py.h5d.CONTIGUOUS, h5py.h5d.CHUNKED):
            self.supported, self.why = False, "virtual/unknown layout"
        if self.stored.kind not in "biufcS" or self.stored.hasobject:
            self.supported, self.why = False, f"dtype {self.stored}"
        if self.supported and len(self.filters) + (1 if self.swap else 0) > _ferry.MAX_CODECS:
            self.supported, self.why = False, "too many filters"
        self.fill = None
        if self.supported:
            fv = dset.fillvalue
            fb = np.array(fv, dtype=self.stored).astype(_native(self.stored)).tobytes()
            self.fill = fb
            if len(fb) > 16:
                self.supported, self.why = False, "fill value wider than 16 bytes"
        self.chunks = tuple(dset.chunks) if dset.chunks else None
        self.file_size = os.path.getsize(path)
        self._table = None
        self._lock = threading.Lock()
        self.offset = self.nbytes = None
        if self.layout == h5py.h5d.CONTIGUOUS and self.supported:
            self.offset = dset.id.get_offset()
            self.nbytes = dset.id.get_storage_size()

    def table(self):
        """The chunk table (ferry_plan_layout's), built once from h5py's chunk_iter."""
        with self._lock:
            if self._table is None:
                nd = len(self.shape)
                if self.chunks is None:     # contiguous: one chunk, the whole array (absent if never written)
                    rows = [] if self.offset is None or 0 in self.shape else [((0,) * nd, self.offset, self.nbytes, 0)]
                else:
                    rows = []
                    dsid = self.dset.id
                    if hasattr(dsid, "chunk_iter"):
                        dsid.chunk_iter(lambda i: rows.append((i.chunk_offset, i.byte_offset, i.size, i.filter_mask)))
                    else:
                        for i in range(dsid.get_num_chunks()):
                            i = dsid.get_chunk_info(i)
                            rows.append((i.chunk_offset, i.byte_offset, i.size, i.filter_mask))
                n = len(rows)
                origins = np.array([r[0] for r in rows], dtype=np.uint64).reshape(n, nd)
                mask = np.array([r[3] for r in rows], dtype=np.uint32)
                # HDF5 numbers filters in the order they encode; the layout's
                # codecs are in decoding order
                nf = len(self.filters)
                skips = np.zeros(n, dtype=np.uint32)
                for i in range(nf):
                    skips |= ((mask >> i) & 1) << (nf - 1 - i)
                self._table = _ferry.chunk_table(self.shape, self.chunks or self.shape, origins,
                                                 np.array([r[1] for r in rows], dtype=np.uint64),
                                                 np.array([r[2] for r in rows], dtype=np.uint64), skips)
            return self._table

    def _layout(self, label: str):
        """The arguments of this variable's layout (Plan.layout, _ferry.layout) but the selection."""
        return ((self.shape, self.chunks or self.shape, self.itemsize),
                dict(table=self.table(), path=self.path, codecs=self.filters[::-1],
                     swap=self.swap_size if self.swap else 0, fill=self.fill, label=label, file_size=self.file_size))

    def add_to_plan(self, plan: ferry.Plan, triples, dst, label: str):
        """Plan the selection `triples` into dst (C order): ferry_plan_layout."""
        args, kw = self._layout(label)
        plan.layout(dst, *args, selection=triples if self.shape else None, **kw)

    def row_layout(self, label: str):
        """The layout add_to_plan plans, described once (_ferry.layout), for Plan.read_rows."""
        with self._lock:
            lay = getattr(self, "_row_layout", None)
        if lay is None:
            args, kw = self._layout(label)
            lay = _ferry.layout(*args, **kw)
            with self._lock:
                self._row_layout = lay
        return lay


def _h5_dims(dset, dimid_names: dict) -> tuple | None:
    if dset.ndim == 0:
        return ()
    if "DIMENSION_LIST" in dset.attrs:
        names = []
        try:
            dl = dset.attrs["DIMENSION_LIST"]
            for refs in dl:
                ref = refs[0] if len(refs) else None
                if ref is None:
                    return None
                names.append(dset.file[ref].name.rsplit("/", 1)[-1])
            return tuple(n[len(_NON_COORD):] if n.startswith(_NON_COORD) else n for n in names)
        except Exception:  # noqa: BLE001 — malformed references: use phony dims
            return None
    if "_Netcdf4Coordinates" in dset.attrs:
        ids = [int(i) for i in np.atleast_1d(dset.attrs["_Netcdf4Coordinates"])]
        if all(i in dimid_names for i in ids):
            return tuple(dimid_names[i] for i in ids)
    cls = dset.attrs.get("CLASS", b"")
    if cls == b"DIMENSION_SCALE" and dset.ndim == 1:
        n = dset.name.rsplit("/", 1)[-1]
        return (n[len(_NON_COORD):] if n.startswith(_NON_COORD) else n,)
    return None


def _h5_error(path: str, what: str, e: BaseException) -> ferry.FerryError:
    """h5py's exception (damaged or truncated file) as FerryError naming the file and the object."""
    msg = str(e) or type(e).__name__
    return ferry.FerryError(_ferry.EFORMAT, f"{path}: {what}: {msg}")


def _h5_member(grp, k: str, path: str):
    """grp[k], or FerryError naming the object: h5py's Group.items() yields None
    for a member it cannot open, which would drop the variable without a word."""
    try:
        obj = grp[k]
    except Exception as e:  # noqa: BLE001
        raise _h5_error(path, f"cannot open object {grp.name.rstrip('/')}/{k}", e) from None
    if obj is None:
        raise ferry.FerryError(_ferry.EFORMAT, f"{path}: cannot open object {grp.name.rstrip('/')}/{k}")
    return obj


def _h5_open(path: str):
    import h5py
    try:
        return h5py.File(path, "r")
    except Exception as e:  # noqa: BLE001 — truncated, damaged, not HDF5 after all
        raise _h5_error(path, "cannot open as HDF5/netCDF-4", e) from None


def _h5_scan(path: str, group: str | None):
    """(specs, attrs, dims, unlimited, h5file) of an HDF5 / netCDF-4 group. Any
    object or attribute h5py cannot read is a FerryError naming it (netCDF4 and
    h5netcdf refuse such files too): a variable is never silently dropped."""
    f = _h5_open(path)
    try:
        return _h5_scan_open(f, path, group)
    except ferry.FerryError:
        f.close()
        raise
    except Exception as e:  # noqa: BLE001
        f.close()
        raise _h5_error(path, "damaged HDF5 metadata", e) from None


def _h5_scan_open(f, path: str, group: str | None):
    import h5py
    # Every object header of the file, as netCDF4 reads them all at open: a damaged
    # group elsewhere in the file makes netCDF4 refuse the file, so ferry does too.
    try:
        f.visit(lambda name: None)
    except Exception as e:  # noqa: BLE001
        raise _h5_error(path, "damaged HDF5 metadata", e) from None
    g = f
    if group not in (None, "", "/"):
        node = f
        for part in group.strip("/").split("/"):
            if part not in node:
                raise ferry.FerryError(_ferry.ENOTFOUND, f"{path}: no group {group!r} "
                                       f"({node.name!r} has {sorted(node.keys())!r})")
            node = _h5_member(node, part, path)
            if not isinstance(node, h5py.Group):
                raise ferry.FerryError(_ferry.ENOTFOUND, f"{path}: {group!r} is not a group")
        g = node
    # dimension ids of every dimension scale visible from this group
    dimid_names = {}
    dims, unlimited = {}, set()
    node = g
    chain = []
    while True:
        chain.append(node)
        if node.name == "/":
            break
        node = node.parent
    members = {}
    for grp in reversed(chain):
        for k in grp.keys():
            obj = _h5_member(grp, k, path)
            if grp is g:
                members[k] = obj
            if isinstance(obj, h5py.Dataset) and obj.attrs.get("CLASS", b"") == b"DIMENSION_SCALE":
                name = k[len(_NON_COORD):] if k.startswith(_NON_COORD) else k
                if "_Netcdf4Dimid" in obj.attrs:
                    dimid_names[int(np.asarray(obj.attrs["_Netcdf4Dimid"]).ravel()[0])] = name
                if grp is g and obj.ndim >= 1:
                    dims[name] = int(obj.shape[0])
                    if obj.maxshape and obj.maxshape[0] is None:
                        unlimited.add(name)
    specs = []
    phony = 0
    for k, obj in members.items():
        if not isinstance(obj, h5py.Dataset):
            continue
        try:
            nm = obj.attrs.get("NAME", b"")
            if isinstance(nm, bytes) and nm.startswith(_NC_DIM_ONLY):
                continue
            name = k[len(_NON_COORD):] if k.startswith(_NON_COORD) else k
            vd = _h5_dims(obj, dimid_names)
            if vd is None:
                vd = tuple(f"phony_dim_{phony + i}" for i in range(obj.ndim))
                phony += obj.ndim
            for d, n in zip(vd, obj.shape):
                dims.setdefault(d, int(n))
            attrs = _h5_attrs(obj)
            stored = obj.dtype
            encoding = {"source": path, "original_shape": tuple(obj.shape)}
            vlen = h5py.check_dtype(vlen=stored)
            if vlen is str or vlen is bytes or stored.kind == "O":
                dtype = np.dtype(object)
                src, kind, why = obj, "h5py", "variable-length strings"
                encoding["dtype"] = str if vlen is str else stored
            else:
                dtype = _native(stored)
                encoding["dtype"] = stored
                s = _H5Source(path, obj, dtype)
                if s.supported:
                    src, kind, why = s, "h5", ""
                else:
                    src, kind, why = obj, "h5py", s.why
            if obj.chunks:
                encoding["chunksizes"] = tuple(obj.chunks)
                encoding["preferred_chunks"] = dict(zip(vd, obj.chunks))   # as h5netcdf: chunks={} follows them
                encoding["contiguous"] = False
                if obj.compression == "gzip":
                    encoding["zlib"] = True
                    encoding["complevel"] = obj.compression_opts
                encoding["shuffle"] = bool(obj.shuffle)
                encoding["fletcher32"] = bool(obj.fletcher32)
            else:
                encoding["contiguous"] = True
                encoding["chunksizes"] = None
            encoding["ferry_reader"] = "engine" if kind == "h5" else "h5py"
            if kind == "h5py":
                log.info("%s: variable %s is read by h5py on the CPU (%s)", path, name, why)
            specs.append(_VarSpec(name, vd, obj.shape, dtype, attrs, encoding, kind, src))
        except ferry.FerryError:
            raise
        except Exception as e:  # noqa: BLE001
            raise _h5_error(path, f"variable {obj.name}", e) from None
    gattrs = _h5_attrs(g)
    return specs, gattrs, dims, unlimited, f


def _h5_groups(path: str) -> list:
    import h5py
    out = []
    with _h5_open(path) as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Group):
                out.append("/" + name)
        try:
            f.visititems(visit)
        except Exception as e:  # noqa: BLE001
            raise _h5_error(path, "damaged HDF5 metadata", e) from None
    return ["/"] + out


def _h5_identity(h5file, path) -> tuple:
    """Identity of the file h5py holds open, checked against what `path` names now:
    the engine reads chunk bytes by path, so both must be one file."""
    try:
        st = os.fstat(int(h5file.id.get_vfd_handle()))
        held = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    except Exception:  # noqa: BLE001 — a driver without a descriptor: the path's stat
        held = _file_identity(path)
    if _file_identity(path) != held:
        h5file.close()
        raise ferry.FerryError(_ferry.EIO, f"{path}: the file was replaced while it was being opened")
    return held
