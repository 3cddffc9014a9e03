#!/usr/bin/env bash
# Generate the Go stubs with Debian's protoc, protoc-gen-go and protoc-gen-go-grpc,
# then build and test the client in GOPATH mode against Debian's Go libraries
# (/usr/share/gocode): `clients/go/build.sh test` needs MILLM_TEST_TARGET.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
work="$here/.gopath"
pkg="$work/src/millm.ai/client"
rm -rf "$work"
mkdir -p "$pkg/millmv1"
cp "$here"/*.go "$pkg/"
maps=()
for proto in "$root"/proto/millm/v1/*.proto; do
  maps+=("M${proto#"$root/proto/"}=millm.ai/client/millmv1")
done
opts="$(IFS=,; echo "${maps[*]}")"
protoc -I "$root/proto" -I /usr/include \
  --go_out="$pkg/millmv1" --go_opt=paths=source_relative,"$opts" \
  --go-grpc_out="$pkg/millmv1" --go-grpc_opt=paths=source_relative,"$opts" \
  "$root"/proto/millm/v1/*.proto
# paths=source_relative keeps millm/v1/ below the output; the package is flat.
mv "$pkg"/millmv1/millm/v1/*.go "$pkg/millmv1/" && rm -rf "$pkg/millmv1/millm"
export GOPATH="$work:/usr/share/gocode" GO111MODULE=off GOFLAGS=-mod=mod GOCACHE="$work/cache"
unset GOFLAGS
cd "$pkg"
go vet . ./millmv1
if [ "${1:-build}" = test ]; then
  go test -count=1 -v .
else
  go build . ./millmv1
fi
