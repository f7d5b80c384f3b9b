"""The skeleton library's tables, which the core app made in its migration 0012 before the
library had an app of its own.

On a database made since, this creates them. On one where infraops 0012 ran before the move,
the tables exist (same names, same columns): they are adopted as they are, rows and all, and
the content types move to this app so that permissions and admin history follow them.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

MODELS = ("skeleton", "skeletonevidence", "skeletonuse")


class CreateOrAdopt(migrations.CreateModel):
    """CreateModel that leaves an existing table of the same name alone (see above)."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        model = to_state.apps.get_model(app_label, self.name)
        if model._meta.db_table in schema_editor.connection.introspection.table_names():
            return
        super().database_forwards(app_label, schema_editor, from_state, to_state)


def content_types_move(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    for model in MODELS:
        if not ContentType.objects.filter(app_label="skeletons", model=model).exists():
            ContentType.objects.filter(app_label="infraops", model=model).update(
                app_label="skeletons")


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('agents', '0004_run_outcomes'),
        ('contenttypes', '0002_remove_content_type_name'),
        ('infraops', '0013_seed_skeletons'),
        ('reviews', '0004_pending_index'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RunPython(content_types_move, migrations.RunPython.noop),
        CreateOrAdopt(
            name='Skeleton',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=200)),
                ('slug', models.SlugField(max_length=80, unique=True)),
                ('summary', models.CharField(help_text='The technique in a sentence or two.', max_length=500)),
                ('status', models.CharField(choices=[('draft', 'draft'), ('reviewed', 'reviewed'), ('trusted', 'trusted')], default='draft', max_length=10)),
                ('applicability', models.JSONField(blank=True, default=list, help_text='Checkable conditions over the probe\'s metadata and measured facts, a JSON list: [{"field": "dtype", "op": "in", "value": ["fp32", "tf32"]}, {"field": "bottleneck", "op": "eq", "value": "precision"}, {"field": "seq_len", "op": ">=", "value": 1024}]. Ops: eq, ne, in, not_in, <, <=, >, >=.', verbose_name='conditions')),
                ('applicability_prose', models.TextField(blank=True, help_text='What the predicates cannot say: when it applies, and when it does not.', verbose_name='conditions in words')),
                ('transformation', models.TextField(help_text='What to change, with a sketch of the diff.')),
                ('resource_constraints', models.TextField(blank=True, help_text='What it costs or needs: registers, memory, occupancy, hardware.')),
                ('provenance', models.CharField(help_text='The public project or the change it was distilled from.', max_length=300)),
                ('provenance_url', models.URLField(blank=True, verbose_name='provenance link')),
                ('promoted_at', models.DateTimeField(blank=True, null=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('updated_at', models.DateTimeField(auto_now=True)),
                ('created_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('promoted_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('proposed_from', models.OneToOneField(blank=True, help_text='The merged change this draft was proposed from (one draft per change).', null=True, on_delete=django.db.models.deletion.PROTECT, related_name='proposed_skeleton', to='reviews.change')),
            ],
            options={
                'db_table': 'infraops_skeleton',
                'ordering': ['name'],
            },
        ),
        CreateOrAdopt(
            name='SkeletonEvidence',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('note', models.CharField(blank=True, max_length=300)),
                ('added_at', models.DateTimeField(auto_now_add=True)),
                ('change', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='reviews.change')),
                ('experiment', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='infraops.experiment')),
                ('skeleton', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='evidence', to='skeletons.skeleton')),
            ],
            options={
                'db_table': 'infraops_skeletonevidence',
                'verbose_name_plural': 'skeleton evidence',
                'ordering': ['skeleton', '-added_at', '-id'],
                'constraints': [models.CheckConstraint(condition=models.Q(('experiment__isnull', False), ('change__isnull', False), _connector='OR'), name='skeleton_evidence_names_something'), models.UniqueConstraint(fields=('skeleton', 'experiment', 'change'), name='skeleton_evidence_once', nulls_distinct=False)],
            },
        ),
        CreateOrAdopt(
            name='SkeletonUse',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('note', models.TextField(blank=True, help_text='What the agent said it applied, and where.')),
                ('outcome', models.CharField(choices=[('applied', 'applied, not yet decided'), ('accepted', 'accepted (merged)'), ('rejected', 'rejected')], default='applied', max_length=10)),
                ('gain', models.FloatField(blank=True, help_text="Times better on the goal's metric (1.71 = 1.71x), from the change's evidence; empty when no gain was verified.", null=True)),
                ('applied_at', models.DateTimeField(auto_now_add=True)),
                ('decided_at', models.DateTimeField(blank=True, null=True)),
                ('change', models.ForeignKey(blank=True, help_text="The run's change that carries this use (set when the run submits one).", null=True, on_delete=django.db.models.deletion.PROTECT, related_name='skeleton_uses', to='reviews.change')),
                ('run', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='skeleton_uses', to='agents.agentrun')),
                ('skeleton', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='uses', to='skeletons.skeleton')),
            ],
            options={
                'db_table': 'infraops_skeletonuse',
                'ordering': ['-applied_at', '-id'],
                'constraints': [models.UniqueConstraint(condition=models.Q(('outcome', 'applied')), fields=('skeleton', 'run'), name='skeleton_use_open_once_per_run')],
            },
        ),
    ]
