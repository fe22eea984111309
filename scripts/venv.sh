# Sourced by run_local.sh and run_tests.sh: create or update .venv from the pinned set.
# Extras (setup.py): run_local.sh takes "transform" (the reader and --transform need
# TensorFlow), run_tests.sh "test" (which includes it); "" is the TensorFlow-free job.
VENV="${VENV:-.venv}"
ensure_venv() {  # $1: extras, e.g. "test", "transform" or ""
  local extras="$1" spec="." stamp
  [ -n "$extras" ] && spec=".[$extras]"
  if [ ! -x "$VENV/bin/python" ]; then
    echo "Creating $VENV (first run installs apache-beam${extras:+ and the $extras extra}: a few minutes, up to ~3 GB)..."
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q -c constraints.txt pip  # the pinned pip, as in the images
  fi
  stamp="$VENV/.installed-$(cat setup.py constraints.txt | sha256sum | cut -c1-16)-${extras:-base}"
  if [ ! -f "$stamp" ]; then
    # Quiet unless it fails: setuptools' editable build prints warnings even under -q.
    if ! "$VENV/bin/pip" install -q -c constraints.txt -e "$spec" > "$VENV/pip-install.log" 2>&1; then
      cat "$VENV/pip-install.log" >&2
      echo "error: installing $spec into $VENV failed (log above, also in $VENV/pip-install.log)" >&2
      return 1
    fi
    touch "$stamp"
  fi
}
