"""An omnigraph plugin: the ``loop`` generate backend, the ``even_digits`` task, the ``exact_copy`` reward."""
