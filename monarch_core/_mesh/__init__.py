"""Mesh shapes (Extent, Point, Region, MeshTrait) and ValueMesh."""
