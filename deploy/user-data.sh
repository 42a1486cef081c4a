#!/bin/bash
# EC2 user-data for broker worker instances (runs once, as root, at first boot via cloud-init).
#
# Makes a stock AMI that already has python3 (Amazon Linux 2023, Ubuntu, Debian) ready for the
# broker's worker agent, which the master ships over SSH and starts itself:
#   - the instance's SSH host keys printed on its console first, between the lines
#     "-----BEGIN SSH HOST KEY KEYS-----" and "-----END SSH HOST KEY KEYS-----", the block the
#     master reads through GetConsoleOutput under aws.host_key_policy: console (cloud-init
#     prints the same block itself on these AMIs; the last complete block counts),
#   - a `broker` user that accepts the launch key pair (copied from the AMI's default user),
#   - /opt/broker-agent for the agent and task outputs, owned by that user, mode 700,
#   - /var/lib/broker/ready written last, so the master can tell set-up finished.
# It installs nothing, downloads nothing and reports to no one: no network access at all.
#
# The inventory that launches with it (aws.user_data: deploy/user-data.sh) logs in as that
# user and ships the agent into that directory:
#   aws:
#     user: broker
#     agent_dir: /opt/broker-agent
#     host_key_policy: console
set -euo pipefail

AGENT_USER=broker
AGENT_DIR=/opt/broker-agent
READY_FILE=/var/lib/broker/ready

log() { echo "broker-user-data: $*" | tee -a /var/log/broker-user-data.log >&2; }

# The host keys exist before user-data runs on cloud-init AMIs; wait a little in case sshd
# generates them at its own first start. No block is printed without keys: an empty last
# block would hide the one cloud-init printed.
host_keys_block() {
    local waited=0 pub found=""
    while [ "$waited" -lt 120 ]; do
        found=$(ls /etc/ssh/ssh_host_*_key.pub 2>/dev/null || true)
        [ -n "$found" ] && break
        sleep 2
        waited=$((waited + 2))
    done
    if [ -z "$found" ]; then
        log "no SSH host keys in /etc/ssh after ${waited}s: none printed on the console"
        return 0
    fi
    echo "-----BEGIN SSH HOST KEY KEYS-----"
    for pub in $found; do
        cut -d' ' -f1-2 "$pub"
    done
    echo "-----END SSH HOST KEY KEYS-----"
}
KEYS_BLOCK=$(host_keys_block)
if [ -n "$KEYS_BLOCK" ]; then
    # The serial console is what GetConsoleOutput returns; standard output goes to
    # /var/log/cloud-init-output.log (and, on most AMIs, to the console as well).
    if [ -w /dev/console ]; then
        printf '%s\n' "$KEYS_BLOCK" > /dev/console || true
    fi
    printf '%s\n' "$KEYS_BLOCK"
fi

PYTHON=$(command -v python3 || true)
if [ -z "$PYTHON" ]; then
    log "python3 not found on this AMI: choose an AMI that ships python3 (>= 3.8)"
    exit 1
fi
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 8))'; then
    log "$("$PYTHON" --version 2>&1) is too old: the worker agent needs python3 >= 3.8"
    exit 1
fi

if ! id -u "$AGENT_USER" >/dev/null 2>&1; then
    useradd --create-home --shell /bin/bash --comment "broker worker agent" "$AGENT_USER"
fi
AGENT_HOME=$(getent passwd "$AGENT_USER" | cut -d: -f6)

# The key pair named at launch lands in the default user's authorized_keys (cloud-init);
# give the broker user the same key so the master can log in as it.
install -d -m 700 -o "$AGENT_USER" -g "$AGENT_USER" "$AGENT_HOME/.ssh"
for default_user in ec2-user ubuntu admin debian; do
    keys=/home/$default_user/.ssh/authorized_keys
    if [ -s "$keys" ]; then
        install -m 600 -o "$AGENT_USER" -g "$AGENT_USER" "$keys" "$AGENT_HOME/.ssh/authorized_keys"
        break
    fi
done
if [ ! -s "$AGENT_HOME/.ssh/authorized_keys" ]; then
    log "no authorized_keys of a default user found; log in with the AMI's default user instead"
fi

install -d -m 700 -o "$AGENT_USER" -g "$AGENT_USER" "$AGENT_DIR" "$AGENT_DIR/outputs"  # the agent, its state, task outputs: the broker user only
install -d -m 755 "$(dirname "$READY_FILE")"
printf 'python=%s\nagent_dir=%s\nuser=%s\n' "$PYTHON" "$AGENT_DIR" "$AGENT_USER" > "$READY_FILE"
log "ready: $("$PYTHON" --version 2>&1), agent directory $AGENT_DIR, user $AGENT_USER"
