"""patch() stages that work from the traced decoder layer rather than from module names.

``partition``: the sites of a decoder family that has no adapter in ``patches/``, found from the
data flow of one decode-shaped forward (``trace``). See docs/architecture.md ("patch(): sites
come from the traced layer").
"""
