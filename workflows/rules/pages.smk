# The docs' results pages (studies/pages.py): the README, docs/results.md and one page per study,
# rendered from what the studies published. Every study's publish step renders them again after it
# publishes; this target renders them from the published tables as they are (no study reruns):
#   snakemake --cores 1 docs


localrules:
    docs,


rule docs:
    input:
        templates=[page.template for page in rendered_pages().values()],
        published=[str(p) for name in STUDIES for p in Path(STUDIES[name].published).rglob("*") if p.is_file()],
    output:
        f"{STUDY_OUT}/pages.txt",
    log:
        f"{STUDY_OUT}/logs/pages.log",
    conda:
        CPU_ENV
    shell:
        "python -m studies pages > {output} 2> {log}"
