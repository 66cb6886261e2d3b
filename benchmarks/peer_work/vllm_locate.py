# vLLM's version and package directory without importing vLLM (peers benchmark):
# importlib.metadata for the version, find_spec (which does not run the package) for the
# directory. Prints one JSON line.
import importlib.metadata
import importlib.util
import json
import os

spec = importlib.util.find_spec("vllm")
print(
    json.dumps(
        {
            "version": importlib.metadata.version("vllm"),
            "path": os.path.dirname(spec.origin),
        }
    )
)
