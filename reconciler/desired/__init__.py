"""The desired-state layer: YAML files in, a normalised :class:`~reconciler.model.Desired` out.

Stages, each reporting located problems rather than stopping at the first: ``source`` (read and
parse with positions), ``shape`` (``schemas/desired-state.schema.json``), ``normalise`` (model
values: long profile names, parsed addresses, VF keys), ``checks`` (offline semantic checks
from profile names and the catalogue), all driven by ``loader``. Importing this package is
cheap: PyYAML and jsonschema load on first use.
"""

from reconciler.desired.loader import load_desired, load_document, validate_files
from reconciler.desired.schemas import schema_path
from reconciler.desired.source import directory_files

__all__ = ["directory_files", "load_desired", "load_document", "schema_path", "validate_files"]
