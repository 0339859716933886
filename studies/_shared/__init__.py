"""What studies share on top of the rig's front door (`localrl`). Not a study (the leading underscore):
studies import it, never each other."""
