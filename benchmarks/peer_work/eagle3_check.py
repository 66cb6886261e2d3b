# The EAGLE-3 check a user of a peer tool ships to each host (peers benchmark, not fleet).
#
#     PYTHON eagle3_check.py PACKAGE_DIR      (or: PYTHON - PACKAGE_DIR < eagle3_check.py)
#
# Parses deepseek_v2.py, kimi_k25.py and config/speculative.py with `ast` in the host's
# Python (vLLM is never imported) and prints one JSON line: for each model class whether
# SupportsEagle3 is among its bases (directly or through a base class of the same file),
# and the entries of the config-time allowlist.
import ast
import json
import os
import sys

CLASSES = {
    "DeepseekV2ForCausalLM": "model_executor/models/deepseek_v2.py",
    "DeepseekV3ForCausalLM": "model_executor/models/deepseek_v2.py",
    "KimiK25ForConditionalGeneration": "model_executor/models/kimi_k25.py",
}
ALLOWLIST_FILE = "config/speculative.py"
ALLOWLIST_NAMES = ("eagle3_target_supported", "aux_hidden_states_supported")


def base_name(node):
    if isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def classes(path):
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    return {
        n.name: [base_name(b) for b in n.bases]
        for n in ast.walk(tree)
        if isinstance(n, ast.ClassDef)
    }


def supports(table, name, seen=()):
    if name not in table or name in seen:
        return False
    bases = table[name]
    return "SupportsEagle3" in bases or any(supports(table, b, (*seen, name)) for b in bases)


def allowlist(path):
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, (ast.List, ast.Tuple))
            and any(isinstance(t, ast.Name) and t.id in ALLOWLIST_NAMES for t in node.targets)
        ):
            return [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
    return None


def main(package_dir):
    tables = {}
    eagle3 = {}
    for cls, rel in CLASSES.items():
        path = os.path.join(package_dir, rel)
        if rel not in tables:
            tables[rel] = classes(path) if os.path.isfile(path) else {}
        eagle3[cls] = supports(tables[rel], cls) if cls in tables[rel] else None
    path = os.path.join(package_dir, ALLOWLIST_FILE)
    entries = allowlist(path) if os.path.isfile(path) else None
    print(json.dumps({"eagle3": eagle3, "allowlist": entries}))


main(sys.argv[1])
