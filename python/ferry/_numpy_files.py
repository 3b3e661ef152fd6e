"""Files numpy writes that ferry's npy reader does not plan: the members of an .npz (numpy's zip
of .npy files) and structured (record) .npy arrays, read to host memory by numpy's own reader
and placed as ferry.read places anything (a selection, out=, a device)."""
from __future__ import annotations

import builtins
import os

from . import Context, FerryError, _check_out, _ferry, _prepare_dst, _sync_producer, normalize_selection, parse_device


def _is_zip(path: str) -> bool:
    try:
        with builtins.open(path, "rb") as fh:
            return fh.read(4) == b"PK\x03\x04"
    except OSError:
        return False


def _read_npz(path: str, name: str | None, *, device, selection, out, ctx: Context, out_bytes: bool):
    """A member of an .npz (numpy's zip of .npy files, stored or deflated) by its
    name, as np.load(path)[name] reads it: the member's npy header and bytes
    through numpy's own reader (the zip's deflate is not ferry's to redo),
    then the selection and the destination as for any read."""
    import zipfile

    import numpy as np
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        raise FerryError(_ferry.EFORMAT, f"{path}: a zip archive ferry cannot read ({e})") from e
    with zf:
        members = [n[:-4] for n in zf.namelist() if n.endswith(".npy")]
        if not members:
            raise FerryError(_ferry.ENOFORMAT, f"{path}: a zip archive without .npy members (not an .npz); "
                                               "a torch.save file is read with torch.load")
        if name is None:
            if len(members) != 1:
                raise FerryError(_ferry.EINVAL, f"{path}: an .npz of {len(members)} arrays; name one of "
                                                f"{members[:20]}")
            name = members[0]
        key = name[:-4] if name.endswith(".npy") else name
        if key not in members:
            raise FerryError(_ferry.ENOTFOUND, f"{path}: no array {name!r} in the .npz (it holds {members[:20]})")
        try:
            with zf.open(key + ".npy") as m:
                host = np.lib.format.read_array(m, allow_pickle=False)
        except Exception as e:  # noqa: BLE001 — a damaged member: zlib's, zipfile's or numpy's error
            raise FerryError(_ferry.EFORMAT, f"{path}: member {key}.npy: {e}") from e
    return _place_host(path, key, host, device=device, selection=selection, out=out, ctx=ctx, out_bytes=out_bytes)


def _place_host(path: str, key: str, host, *, device, selection, out, ctx: Context, out_bytes: bool):
    """A host array numpy read (an .npz member, a structured .npy): the selection,
    then the destination, as ferry.read places any read."""
    import numpy as np
    triples, sel_shape, squeeze = normalize_selection(selection, host.shape)
    if triples is not None:
        host = host[tuple(a if ax in squeeze else slice(a, b, st) for ax, (a, b, st) in enumerate(triples))]
    host = np.ascontiguousarray(host)
    where = f"{path}: {key}"
    if out is not None:
        _check_out(out, host.nbytes, host.shape, host.dtype.str, where, out_bytes)
        _sync_producer(out)
        if host.nbytes:
            ctx.memcpy(out, host)
        return out
    dev = parse_device(device)
    if dev < 0:
        return host
    if host.dtype.fields is not None:
        raise FerryError(_ferry.EUNSUPPORTED, f"{where}: a structured dtype {host.dtype} has no GPU array; "
                                              "read it to the host (device=\"cpu\")")
    dst, _ = _prepare_dst(None, host.nbytes, host.shape, host.dtype.str, dev, ctx, where)
    if host.nbytes:
        ctx.memcpy(dst, host)
    return dst


def _read_structured_npy(path: str, **kw):
    """A structured (record) .npy, as np.load gives it: numpy's reader maps the
    file; ferry's engine has no record type to place on a GPU (an error there)."""
    import numpy as np
    try:
        host = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as e:  # noqa: BLE001 — numpy's view of a damaged header
        raise FerryError(_ferry.EFORMAT, f"{path}: {e}") from e
    return _place_host(path, os.path.basename(path), host, **kw)


