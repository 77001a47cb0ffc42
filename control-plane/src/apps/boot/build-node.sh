# The build of a JavaScript or TypeScript app, in its sandbox (the service's script, not
# the app's): its dependencies from package.json (exactly as package-lock.json says, when
# there is one), then the loader describes the apps and actions the entrypoint defines.
# $1 is the entrypoint.
set -eu
cd /app
if [ -f package-lock.json ]; then
  echo "installing the dependencies package-lock.json pins"
  npm ci --omit=dev --no-audit --no-fund
elif [ -f package.json ]; then
  echo "installing the dependencies package.json lists"
  npm install --omit=dev --no-audit --no-fund
else
  echo "no package.json: nothing to install"
fi
echo "loading $1"
exec node /run/app/boot.mjs describe "$1"
