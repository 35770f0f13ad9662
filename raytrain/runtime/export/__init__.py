"""``raytrain export``, in a process of its own: a checkpoint consolidated (consolidate) into a state_dict (entry) or a Hugging Face folder (hf, hf_trainer)."""
