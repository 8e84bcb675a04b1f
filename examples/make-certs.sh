#!/usr/bin/env bash
# Certificates for P4Runtime over mutual TLS (inalab switch --p4runtime-tls, inalab ctl
# --tls, INALAB_P4RUNTIME_TLS): a CA, one certificate per switch naming the addresses
# controllers dial, and one per controller. Keys are P-256, valid for 365 days.
#
#   examples/make-certs.sh DIR switch:IP[,IP...] [controller-name ...]
#
# makes DIR/ca.{crt,key}, DIR/switch.{crt,key} (subjectAltName: each IP, and localhost)
# and DIR/NAME.{crt,key} per controller name (default: one named "controller"). Keep
# ca.key off the switches and workers; give a switch its pair and ca.crt, a controller
# its pair and ca.crt.
set -euo pipefail

if [ $# -lt 2 ] || [[ "$2" != switch:* ]]; then
    echo "usage: $0 DIR switch:IP[,IP...] [controller-name ...]" >&2
    exit 2
fi
dir=$1
ips=${2#switch:}
shift 2
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(controller)

mkdir -p "$dir"
umask 077
days=365
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

key "$dir/ca.key"
openssl req -x509 -new -key "$dir/ca.key" -out "$dir/ca.crt" -days "$days" \
    -subj "/CN=inalab P4Runtime CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"

# sign NAME CN EXTENSIONS: DIR/NAME.key and a certificate for it signed by the CA.
sign() {
    key "$dir/$1.key"
    printf '%s\n' "$3" >"$dir/$1.ext"
    openssl req -new -key "$dir/$1.key" -subj "/CN=$2" -out "$dir/$1.csr"
    openssl x509 -req -in "$dir/$1.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
        -CAcreateserial -days "$days" -extfile "$dir/$1.ext" -out "$dir/$1.crt" 2>/dev/null
    rm -f "$dir/$1.csr" "$dir/$1.ext"
}

san="DNS:localhost"
IFS=, read -ra addrs <<<"$ips"
for ip in "${addrs[@]}"; do
    san="$san,IP:$ip"
done
sign switch "inalab switch" "subjectAltName=$san
extendedKeyUsage=serverAuth
keyUsage=critical,digitalSignature"
for name in "${names[@]}"; do
    sign "$name" "$name" "extendedKeyUsage=clientAuth
keyUsage=critical,digitalSignature"
done
rm -f "$dir/ca.srl"
chmod 644 "$dir"/*.crt
echo "$dir: ca.crt, switch.crt/key ($san), ${names[*]/%/.crt/key}"
