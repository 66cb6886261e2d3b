#!/bin/sh
# fleet sandbox host (docker): what the host's init would start, then sshd in the foreground
# logging to stderr (`docker logs` is the sshd log fleet's tests count connections in).
set -e
if [ -x /usr/bin/supervisord ] && [ -f /etc/supervisor/supervisord.conf ]; then
    # Debian's service: daemonizes, socket /var/run/supervisor.sock, programs from
    # /etc/supervisor/conf.d/*.conf. A restarted container starts it again.
    rm -f /var/run/supervisor.sock /var/run/supervisord.pid
    /usr/bin/supervisord -c /etc/supervisor/supervisord.conf
fi
exec /usr/sbin/sshd -D -e
