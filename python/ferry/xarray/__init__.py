"""xarray backend: ``xr.open_dataset(path, engine="ferry", device=0)``.

Metadata and coordinates on the CPU, data variables read by ferry's engine
straight into GPU memory (cupy arrays) or, with ``device="cpu"``, into numpy.

Formats
  netCDF classic (CDF-1/2/5)   ferry's C parser (ferry._ferry.Dataset)
  Zarr v2 / v3                 ferry's C parser
  netCDF-4 / HDF5              ferry's C parser (src/formats/hdf5/): groups,
                               dimensions (scales and phony ones), attributes,
                               every layout and chunk index; the filters
                               ferry decodes; variable-length strings. A
                               variable the parser refuses as unsupported
                               (variable-length sequences, a filter ferry
                               lacks) is read by h5py on the CPU
                               when h5py is installed, logged once on the
                               "ferry" logger with the parser's reason; a
                               damaged one is a FerryError naming the file
                               and byte.
  Zarr arrays ferry cannot read (types, codecs, chunk grids it lacks) go to
  zarr-python; without zarr installed they keep ferry's description (dims,
  attributes) and loading them raises ferry.FerryError with the parser's
  message (which reader took each Zarr variable is logged, not put in
  encoding).

Laziness: every variable is a BackendArray with OUTER indexing; a read becomes
one plan that touches only the chunks / records the selection needs.
``Dataset.load()`` (and ``.compute()``) of a dataset opened here reads all of
its lazy variables with ONE plan (one engine run, many reads in flight).

CF decoding (mask/scale/times/strings) is xarray's own: the backend hands
xarray the attributes the netCDF4/h5netcdf/zarr backends hand it. For data
variables on a GPU, masking and scaling are applied to the cupy array with the
exact parameters xarray's coders choose (same dtypes, same operations).

Device: ``"cpu"`` by default, for open_dataset and open_mfdataset alike (numpy,
as every xarray engine); ``device=0`` / ``"cuda:N"`` puts data variables on
that GPU, and under dask their chunks are cupy with cupy meta
(_install_dask_hook). netCDF-4 encodings carry preferred_chunks from the HDF5
chunks, so ``chunks={}`` follows them as with h5netcdf.

Processes: a FerryStore pickles as its open arguments plus what it parsed and
reopens by path (with the new process's context) in another process, in a
forked child and after close(); the file must still be the one parsed (inode,
size, mtime), else FerryError. Every engine run is bracketed by that check.

Input: local paths (str, bytes, os.PathLike, file://, fsspec mappers and zarr
stores of local directories) and s3://, gs://, http(s):// URLs of Zarr stores
and netCDF classic files, with storage_options= (docs/remote.md; fsspec mappers
of S3/GCS are taken as their URL and options); other schemes are FerryError. Damaged
netCDF-4: the C parser's error naming the file, the byte and the object
(never a dropped variable, never h5py's own exception).
"""
from __future__ import annotations

try:   # the one place that says what to install; the modules below import xarray plainly
    import xarray as _xarray  # noqa: F401
except ImportError as e:
    raise ImportError(f"ferry.xarray needs xarray: pip install ferry-io[xarray] ({e})") from e

from .array import FerryBackendArray
from .backend import FerryBackendEntrypoint, open_mfdataset
from .dask_hook import cupy_meta
from .store import FerryStore

__all__ = ["FerryBackendEntrypoint", "FerryStore", "FerryBackendArray", "cupy_meta", "open_mfdataset"]
