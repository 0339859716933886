"""What studies share on top of the rig's front door (`localrl`): the settings, the two sides, the loop
over settings, scoring against vLLM-CPU, the gradient of a batch. Not a study (the leading underscore):
studies import it, never each other.
"""
