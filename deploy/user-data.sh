#!/bin/bash
# EC2 user-data for broker worker instances (runs once, as root, at first boot via cloud-init).
#
# Makes a stock AMI that already has python3 (Amazon Linux 2023, Ubuntu, Debian) ready for the
# broker's worker agent, which the master ships over SSH and starts itself:
#   - a `broker` user that accepts the launch key pair (copied from the AMI's default user),
#   - /opt/broker-agent for the agent and task outputs, owned by that user,
#   - /var/lib/broker/ready written last, so the master can tell set-up finished.
# It installs nothing, downloads nothing and reports to no one: no network access at all.
set -euo pipefail

AGENT_USER=broker
AGENT_DIR=/opt/broker-agent
READY_FILE=/var/lib/broker/ready

log() { echo "broker-user-data: $*" | tee -a /var/log/broker-user-data.log >&2; }

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

install -d -m 755 -o "$AGENT_USER" -g "$AGENT_USER" "$AGENT_DIR" "$AGENT_DIR/outputs"
install -d -m 755 "$(dirname "$READY_FILE")"
printf 'python=%s\nagent_dir=%s\nuser=%s\n' "$PYTHON" "$AGENT_DIR" "$AGENT_USER" > "$READY_FILE"
log "ready: $("$PYTHON" --version 2>&1), agent directory $AGENT_DIR, user $AGENT_USER"
