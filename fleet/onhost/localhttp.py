# fleet on-host module: HTTP to the vLLM server on this host's own 127.0.0.1 (the one home
# of these requests for the on-host scripts: serve's status and preflight, bench).
#
# Python 3.8+, standard library only.
from typing import Any, Dict, Optional


def health(port: int, timeout: float = 2.0) -> Optional[int]:
    """The HTTP status of GET /health on this host, or None (refused, no answer)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def metrics(port: int, timeout: float = 5.0, limit: int = 512 * 1024) -> Optional[str]:
    """The text of GET /metrics on this host (Prometheus exposition), or None."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        if response.status != 200:
            return None
        return response.read(limit).decode("utf-8", "replace")
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def headers(api_key: Optional[str]) -> Dict[str, Any]:
    """A JSON request's headers (the API key only here, never on a command line)."""
    out = {"Content-Type": "application/json"}
    if api_key:
        out["Authorization"] = "Bearer " + api_key
    return out
