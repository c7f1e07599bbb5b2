def run(bench):
    return []
