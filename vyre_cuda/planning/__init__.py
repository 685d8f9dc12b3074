"""Pure-Python planning: bindings, launch geometry, capabilities, slab layout. CPU-tested."""
