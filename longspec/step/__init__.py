"""The data of a speculative step, below the drafters that propose it and the engine that runs
it: the draft tree, a forward's output, verification, tree sizing and step statistics."""
