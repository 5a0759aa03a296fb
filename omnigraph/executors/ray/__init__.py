"""The Ray executors: the plan on Ray Compiled Graphs (compiled) or as classic actor calls (tasks), their actors, warm workers and sleeping waiters. The only executor code that imports Ray."""
