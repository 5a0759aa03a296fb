"""FlowGRPO: a flow-matching image policy in the same graph as a language model's."""
