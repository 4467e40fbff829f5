"""The two roles a policy plays (designer, agent) and the untrained hint writer."""
