# Sourced by ci/setup.sh and ci/test-torch.sh: the virtual environment and disk-space steps they share.
# Not run on its own.

# PATH itself, or its nearest existing parent: where PATH would be created.
accel_existing() {
  local path=$1
  while [ ! -e "$path" ]; do path=$(dirname "$path"); done
  echo "$path"
}

# Free space, in whole GiB, on the filesystem that holds (or would hold) PATH.
accel_free_gib() {
  df -Pk "$(accel_existing "$1")" | awk 'NR == 2 { print int($4 / 1048576) }'
}

# The mount point of the filesystem that holds (or would hold) PATH.
accel_mount() {
  df -P "$(accel_existing "$1")" | awk 'NR == 2 { print $6 }'
}

# Fails, saying what to do, when the filesystem holding PATH has less than NEED GiB free. The installs below fill
# a disk half-way otherwise, and pip's "No space left on device" names neither the space needed nor the path.
accel_need_disk() {
  local path=$1 need=$2 what=$3 free
  free=$(accel_free_gib "$path")
  if [ "$free" -lt "$need" ]; then
    echo "${ACCEL_SCRIPT:-ci}: $what needs about $need GiB free on the disk holding $path; it has $free GiB." >&2
    echo "${ACCEL_SCRIPT:-ci}: free some space there, or point ${ACCEL_DISK_VARS:-ACCEL_VENV} at a larger disk." >&2
    return 1
  fi
}

# Creates VENV if missing, then runs INSTALL (a function name, called with VENV's pip as "$@") unless VENV was
# already installed from the same pyproject.toml and CONSTRAINTS (a stamp file in VENV records their hash).
accel_ensure_venv() {
  local venv=$1 constraints=$2 install=$3 root python want stamp
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  python=${PYTHON:-python3}
  stamp=$venv/.accel-setup-stamp
  want=$(cat "$root/pyproject.toml" "$constraints" | sha256sum | cut -d' ' -f1)
  if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    return 0
  fi
  if [ ! -x "$venv/bin/python" ]; then
    echo "${ACCEL_SCRIPT:-ci}: creating $venv" >&2
    "$python" -m venv "$venv"
  fi
  local start=$SECONDS
  "$install" "$venv/bin/python" -m pip --disable-pip-version-check
  echo "${ACCEL_SCRIPT:-ci}: installed in $((SECONDS - start)) s" >&2
  echo "$want" > "$stamp"
}
