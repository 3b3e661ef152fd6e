"""storage_options -> ferry's remote options, and a Context holding them.

One translation, names only: the C library (ferry_ctx_set_remote_option) checks
every value and refuses what it does not know, so a misspelt option is an error,
not a silently ignored setting. fsspec / s3fs spellings are taken where they
differ (client_kwargs' endpoint_url, region_name and verify, config_kwargs'
addressing_style)."""
from __future__ import annotations

import threading

_CONTEXTS: dict = {}
_LOCK = threading.Lock()


def _text(v) -> str | None:
    if v is None:
        return None
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def remote_options(storage_options: dict | None) -> dict:
    """The C option names and string values of fsspec-style storage_options:
    endpoint_url, key, secret, token, profile, region, addressing, anon,
    ca_bundle. Other names are passed on unchanged (and refused by C)."""
    out: dict = {}
    for k, v in (storage_options or {}).items():
        if k == "client_kwargs":
            for ck, cv in (v or {}).items():
                if ck == "region_name":
                    out["region"] = cv
                elif ck == "verify":
                    if cv is False:
                        out["verify"] = "false"   # refused by C: verification is always on
                    elif isinstance(cv, str):
                        out["ca_bundle"] = cv
                else:
                    out[ck] = cv
        elif k == "config_kwargs":
            s3 = ((v or {}).get("s3") or {})
            if "addressing_style" in s3:
                out["addressing"] = s3["addressing_style"]
            for ck in v or {}:
                if ck != "s3":
                    out[ck] = v[ck]
        elif k in ("region_name", "region"):
            out["region"] = v
        elif k == "addressing_style":
            out["addressing"] = v
        elif k == "verify" and isinstance(v, str):
            out["ca_bundle"] = v
        elif k == "anon":
            out["anon"] = bool(v)
        else:
            out[k] = v
    return {k: _text(v) for k, v in out.items() if v is not None}


def remote_context(storage_options: dict | None):
    """The default context when there are no options; else a Context with them
    set, one per distinct set of options in this process (a dataset of many
    files shares one engine)."""
    import ferry
    opts = remote_options(storage_options)
    if not opts:
        return ferry.default_context()
    key = tuple(sorted(opts.items()))
    with _LOCK:
        c = _CONTEXTS.get(key)
        if c is None or c.closed:
            c = ferry.Context()
            for name, value in opts.items():
                c.set_remote_option(name, value)
            _CONTEXTS[key] = c
    return c


def is_url(path: str) -> bool:
    """A URL ferry reads remotely (not file://): the C library's rule, by scheme."""
    head, sep, _ = path.partition("://")
    return bool(sep) and head.lower() != "file" and head.replace("+", "").replace("-", "").replace(".", "").isalnum() \
        and head[:1].isalpha()
