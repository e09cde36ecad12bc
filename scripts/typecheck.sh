#!/usr/bin/env bash
# Type-check the admit package with mypy (`make type`; `make test` runs it).
#
# admit's sub-packages live in top-level folders that pyproject.toml maps onto `admit.*` (core/ is
# admit.core ...). mypy does not read that mapping, so this builds the package as mypy should see it: a
# tree of symlinks under build/typecheck/admit, one per folder, and checks it as `-p admit`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
tree=build/typecheck
rm -rf "$tree"
mkdir -p "$tree/admit"
for f in admit/*.py; do ln -s "../../../$f" "$tree/admit/"; done
for pkg in $("$PY" -c "
import tomllib
m = tomllib.load(open('pyproject.toml', 'rb'))['tool']['setuptools']['package-dir']
print(' '.join(v for k, v in m.items() if k.count('.') == 1))"); do
  ln -s "../../../$pkg" "$tree/admit/$pkg"
done
exec "$PY" -m mypy -p admit "$@"
