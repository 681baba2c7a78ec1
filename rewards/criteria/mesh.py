"""3D modelling: a mesh given as OBJ or STL text, parsed with trimesh and checked."""

from __future__ import annotations

import io
import re
from typing import Any, ClassVar

from rewards.registry import Criterion, register
from rewards.types import CriterionError, Outcome, Sample

_FENCE = re.compile(r"```[ \t]*(obj|stl)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
CHECKS = ("watertight", "manifold", "no_degenerate_faces", "face_count", "bounds")
_AXES: dict[str, Any] = {
    "type": "array",
    "items": {"type": "number", "minimum": 0},
    "minItems": 3,
    "maxItems": 3,
}


def mesh_text(response: str) -> tuple[str, str]:
    """(text, "obj" | "stl") from the last fenced block or the whole response."""
    blocks = _FENCE.findall(response)
    text = blocks[-1][1] if blocks else response
    declared = (blocks[-1][0] if blocks else "").lower()
    if declared in ("obj", "stl"):
        return text, declared
    return text, "stl" if re.search(r"^\s*solid\b", text, re.M) else "obj"


@register
class Mesh(Criterion):
    """Parses a mesh (OBJ or STL text) with trimesh and scores the checks it passes.

    The mesh is the last fenced block (```obj / ```stl) or the whole response. Checks
    (``checks``, default all): ``watertight`` (every edge shared by exactly two faces),
    ``manifold`` (watertight, consistently wound, encloses a positive volume),
    ``no_degenerate_faces`` (no face with area below ``min_face_area``, default 1e-12),
    ``face_count`` (within ``min_faces``/``max_faces``), ``bounds`` (bounding-box extents
    within ``min_extent``/``max_extent``, per axis). The score is the fraction passed (or,
    with ``"credit": "all"``, 1 only if all pass); an unparseable mesh scores 0. Text above
    ``max_bytes`` (default 5 MB) is refused unparsed.
    """

    kind = "mesh"
    summary = "An OBJ/STL mesh is watertight, manifold, non-degenerate and within bounds."
    blocking = True
    params_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "checks": {
                "type": "array",
                "items": {"type": "string", "enum": list(CHECKS)},
                "minItems": 1,
                "uniqueItems": True,
            },
            "min_faces": {"type": "integer", "minimum": 0},
            "max_faces": {"type": "integer", "minimum": 1},
            "min_extent": _AXES,
            "max_extent": _AXES,
            "min_face_area": {"type": "number", "minimum": 0},
            "max_bytes": {"type": "integer", "minimum": 1, "maximum": 100_000_000},
            "credit": {"type": "string", "enum": ["fraction", "all"]},
        },
    }

    def evaluate(self, sample: Sample) -> Outcome:
        import numpy as np
        import trimesh

        text, file_type = mesh_text(sample.response)
        limit = int(self.params.get("max_bytes", 5_000_000))
        data = text.encode("utf-8", "replace")
        if len(data) > limit:
            raise CriterionError(f"mesh text larger than {limit} bytes")
        try:
            mesh = trimesh.load(io.BytesIO(data), file_type=file_type, process=True, force="mesh")
        except Exception as exc:
            return Outcome(0.0, {"reason": f"not a {file_type.upper()} mesh: {exc}"[:300]})
        if not isinstance(mesh, trimesh.Trimesh) or len(mesh.faces) == 0:
            return Outcome(0.0, {"reason": "no faces"})
        results: dict[str, bool] = {}
        for check in self.params.get("checks", CHECKS):
            if check == "watertight":
                results[check] = bool(mesh.is_watertight)
            elif check == "manifold":
                results[check] = bool(mesh.is_watertight and mesh.is_winding_consistent) and (
                    float(mesh.volume) > 0
                )
            elif check == "no_degenerate_faces":
                area = float(self.params.get("min_face_area", 1e-12))
                results[check] = bool(np.all(mesh.area_faces > area))
            elif check == "face_count":
                count = len(mesh.faces)
                low = int(self.params.get("min_faces", 1))
                high = self.params.get("max_faces")
                results[check] = count >= low and (high is None or count <= int(high))
            elif check == "bounds":
                extents = [float(e) for e in mesh.extents]
                low_extent = self.params.get("min_extent", [0, 0, 0])
                high_extent = self.params.get("max_extent")
                results[check] = all(
                    e >= lo for e, lo in zip(extents, low_extent, strict=True)
                ) and (
                    high_extent is None
                    or all(e <= hi for e, hi in zip(extents, high_extent, strict=True))
                )
        details = {
            "checks": results,
            "faces": len(mesh.faces),
            "vertices": len(mesh.vertices),
            "extents": [round(float(e), 6) for e in mesh.extents],
        }
        passed = sum(results.values())
        if self.params.get("credit") == "all":
            return Outcome(1.0 if passed == len(results) else 0.0, details)
        return Outcome(passed / len(results), details)
