# Fetches a deployment's source from a git repository, in its sandbox (the service's
# script): $SOURCE_REF of $SOURCE_URL (a branch, tag or commit), then $SOURCE_PATH of it
# (or all of it) copied to /app, and its commit and a checksum of its files written to
# the result file. A token, when given, comes in git's configuration variables.
set -eu
git init -q /tmp/repo
cd /tmp/repo
git remote add origin "$SOURCE_URL"
echo "fetching $SOURCE_REF from $SOURCE_URL"
if git fetch -q --depth 1 origin "$SOURCE_REF" 2>/dev/null; then
  git -c advice.detachedHead=false checkout -q FETCH_HEAD
else
  # Servers that cannot send one commit alone (the dumb HTTP protocol, commits no ref
  # points at): all of it, then the ref.
  git fetch -q origin '+refs/heads/*:refs/remotes/origin/*' '+refs/tags/*:refs/tags/*'
  git -c advice.detachedHead=false checkout -q "origin/$SOURCE_REF" 2>/dev/null \
    || git -c advice.detachedHead=false checkout -q "$SOURCE_REF"
fi
commit=$(git rev-parse HEAD)
echo "checked out $commit"
tree="HEAD"
if [ -n "${SOURCE_PATH:-}" ]; then
  tree="HEAD:$SOURCE_PATH"
fi
checksum=$(git archive --format=tar "$tree" | sha256sum | cut -d' ' -f1)
git archive --format=tar "$tree" | tar -x -C /app
printf '{"ok": true, "commit": "%s", "checksum": "%s"}' "$commit" "$checksum" > /run/app/result.json
