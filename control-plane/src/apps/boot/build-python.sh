# The build of a Python app, in its sandbox (the service's script, not the app's):
# a virtual environment in /app/.venv with the app's dependencies, then the loader
# describes the apps and actions the entrypoint defines. $1 is the entrypoint.
set -eu
cd /app
echo "creating the virtual environment"
python3 -m venv /app/.venv
pip="/app/.venv/bin/python -m pip --disable-pip-version-check --no-input"
if [ -f requirements.txt ]; then
  echo "installing requirements.txt"
  $pip install -r requirements.txt
elif [ -f pyproject.toml ]; then
  echo "installing the dependencies pyproject.toml lists"
  /app/.venv/bin/python - > /tmp/requirements.txt <<'PY'
import tomllib
with open("pyproject.toml", "rb") as source:
    project = tomllib.load(source).get("project", {})
print("\n".join(project.get("dependencies", [])))
PY
  if [ -s /tmp/requirements.txt ]; then
    $pip install -r /tmp/requirements.txt
  fi
else
  echo "no requirements.txt or pyproject.toml: nothing to install"
fi
echo "loading $1"
exec /app/.venv/bin/python /run/app/boot.py describe "$1"
