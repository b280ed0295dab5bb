"""Layer 8: a config change, from the reload to its proof and back. ``classify`` (what a new config
changes for each deployment), ``proof`` (the change proven startable beside what serves), ``rollback`` (the
way back kept, and taken when the change fails). Imports any layer below; ``loop`` drives it."""
