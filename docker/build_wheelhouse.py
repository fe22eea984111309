"""Make the wheelhouse the container images install from, so `docker build` reaches no index.

    python docker/build_wheelhouse.py                      # build/wheelhouse: the job's set
    python docker/build_wheelhouse.py --extras transform   # ... with TensorFlow (EXTRAS=transform)
    python docker/build_wheelhouse.py --out DIR pillow six # a slice (what the test builds)

Every distribution the package needs (with its extras), plus the installers the images pin
(pip, setuptools), as one wheel each at its constraints.txt pin, for the Dataflow worker's
platform: Linux x86_64, CPython 3.11, glibc up to --glibc (2.28: the newest the pins need,
pyarrow's manylinux_2_28, so the wheels run on either base, Debian 10 to 12; at 2.36
cryptography would take its manylinux_2_34 wheel). Run it where an index is reachable, on
that platform (or inside python:3.11-slim-bookworm): `pip wheel` builds the one pin
published only as an sdist (google-apitools, pure Python) here, which a cross-platform
`pip download --platform` cannot. Everything else must come as a published wheel
(--only-binary): nothing compiled against this host's libraries slips in.

It fails, writing nothing, when the resolved set holds a distribution constraints.txt does
not pin (the images would then differ from build to build): pin it there. The images check
the other direction (everything installed equals its pin) with check_pins.py.
"""

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_pins import canonicalize_name, pins  # noqa: E402

try:
    from packaging.version import Version
except ImportError:  # a bare interpreter: pip always carries a copy
    from pip._vendor.packaging.version import Version

REPO = Path(__file__).resolve().parent.parent
INSTALLERS = ("pip", "setuptools")  # the images install these first, pinned, from here
# Pins published only as sdists, built into wheels here: pure Python, so the wheel is
# py3-none-any (checked). Every other distribution must be a published wheel.
SDIST_ONLY = ("google-apitools",)
PYTHON = (3, 11)  # the worker image's (docker/worker.Dockerfile's FROM)
# PEP 600's hook: pip asks an importable `_manylinux` whether a manylinux_2_N wheel runs
# here; answering for the target's glibc keeps a newer build host's wheels out.
MANYLINUX_HOOK = """def manylinux_compatible(major, minor, arch):
    return arch == "x86_64" and (major, minor) <= {glibc}
"""


def host_problem():
    """Why this interpreter can't build the target's wheels, or None."""
    here = (platform.system(), platform.machine(), sys.implementation.name,
            sys.version_info[:2])
    if here != ("Linux", "x86_64", "cpython", PYTHON):
        return (f"wheels for Linux x86_64 CPython {PYTHON[0]}.{PYTHON[1]} are built on it; this is "
                f"{here[0]} {here[1]} {here[2]} {here[3][0]}.{here[3][1]}: run it inside "
                "python:3.11-slim-bookworm")
    return None


def unpinned(wheels, pinned):
    """One line per wheel whose distribution constraints.txt doesn't pin at that version,
    or that was compiled here (a plain linux_* tag: it would run on this host only)."""
    bad = []
    for wheel in wheels:
        name, version = wheel.name.split("-")[:2]
        pin = pinned.get(canonicalize_name(name))
        if pin is None or Version(pin) != Version(version):
            bad.append(f"{wheel.name}: constraints.txt "
                       + (f"pins {pin}" if pin else "does not pin it (pin it there)"))
        elif wheel.name.endswith(("-linux_x86_64.whl", "-linux_aarch64.whl")):
            bad.append(f"{wheel.name}: compiled on this host, not a published manylinux wheel")
    return bad


def build(requirements, out, constraints, glibc, env=None):
    """`pip wheel` the requirements under the constraints into a fresh `out`. Returns the
    wheels, or raises SystemExit with the lines that say what is wrong."""
    pinned = pins(constraints)
    with tempfile.TemporaryDirectory() as tmp:
        hook, wheels = Path(tmp, "hook"), Path(tmp, "wheels")
        hook.mkdir()
        (hook / "_manylinux.py").write_text(MANYLINUX_HOOK.format(glibc=glibc))
        env = dict(os.environ if env is None else env)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(hook), env.get("PYTHONPATH")]))
        done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--wheel-dir", str(wheels),
                               "--only-binary=:all:", f"--no-binary={','.join(SDIST_ONLY)}",
                               "-c", str(constraints), *requirements], env=env)
        if done.returncode:
            raise SystemExit(f"error: pip wheel failed (exit {done.returncode}), output above")
        for own in wheels.glob("image_tfrecords-*.whl"):
            own.unlink()  # the images build the package from its source, after this layer
        built = sorted(wheels.glob("*.whl"))
        bad = unpinned(built, pinned)
        if bad:
            raise SystemExit("\n".join(f"error: {line}" for line in bad))
        shutil.rmtree(out, ignore_errors=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(wheels), str(out))
    return sorted(out.glob("*.whl"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("requirements", nargs="*",
                        help="what to resolve (default: the package with --extras, and pip "
                             "and setuptools)")
    parser.add_argument("--extras", default="", help='setup.py extras, e.g. "transform"')
    parser.add_argument("--out", type=Path, default=REPO / "build" / "wheelhouse")
    parser.add_argument("--constraints", type=Path, default=REPO / "constraints.txt")
    parser.add_argument("--glibc", default="2.28",
                        help="the oldest glibc the wheels must run on (default 2.28)")
    args = parser.parse_args(argv)
    problem = host_problem()
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    requirements = args.requirements or [
        f"{REPO}[{args.extras}]" if args.extras else str(REPO), *INSTALLERS]
    glibc = tuple(int(part) for part in args.glibc.split("."))
    wheels = build(requirements, args.out, args.constraints, glibc)
    size = sum(w.stat().st_size for w in wheels) / 2**20
    print(f"{len(wheels)} wheels ({size:.0f} MiB), each at its constraints.txt pin, in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
