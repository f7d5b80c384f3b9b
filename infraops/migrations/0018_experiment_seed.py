from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('infraops', '0017_target_fetch_state'),
    ]

    operations = [
        migrations.AddField(
            model_name='experiment',
            name='seed',
            field=models.BigIntegerField(blank=True, help_text='INFRAOPS_SEED of every sample (warm-ups and the second-seed check draw another). The experiments of one agent run share it, so the configurations it compares see the same inputs. Blank: drawn at random when it runs.', null=True),
        ),
    ]
