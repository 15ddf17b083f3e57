"""Weight readers and model builders."""
