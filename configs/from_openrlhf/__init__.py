"""`rlhf from-openrlhf`: an OpenRLHF launch script read (bash lexer), its flags mapped onto this project's
config keys, and the reference page of that mapping."""
