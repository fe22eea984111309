"""Change stamps: what a listed file carries so the next build can tell it changed without
reading it. One definition for directory walks and manifests, because the catalog's
`input_stamp` and the fingerprint compare them across builds (docs/format.md)."""


def local_stamp(st):
    """What changes whenever a local file's bytes may have: mtime and ctime in ns.

    `cp -p`, `rsync -a` and tar restore mtime, but nothing sets ctime back: a file replaced
    that way still shows a new stamp (and same-size files are then hashed, not trusted).
    """
    return f"{st.st_mtime_ns}:{st.st_ctime_ns}"


def gcs_stamp(blob):
    """An object's generation: every write makes a new one (a time would be converted
    through the local time zone somewhere: Beam's last_updated_in_seconds uses mktime)."""
    return f"gen:{blob.generation}"
