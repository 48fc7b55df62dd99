"""keras.io's models as keras.io writes them, small data in their shapes, for the tests of
what every training path shares (the loss called as compile calls it, EMA's end of
training, every optimizer in the checkpoint).

- `siamese`: "Image similarity estimation using a Siamese Network with a contrastive
  loss": its embedding tower, Euclidean distance `Lambda`, BatchNormalization, sigmoid
  output `(batch, 1)`, its `contrastive_loss` (a mean over `(1 - y) * p^2 + y *
  max(margin - p, 0)^2`), labels `(batch,)` float32, RMSprop, `accuracy`;
- `mnist_convnet`: "Simple MNIST convnet" (two Conv2D, Dropout, softmax over 10 classes,
  categorical cross-entropy on one-hot labels), with the optimizer a test gives it;
- `gan`: "DCGAN"/"Conditional GAN"'s shape: two models, two Adam optimizers given to its
  own `compile` and built lazily by their first `apply_gradients` in its `train_step`,
  its own loss trackers.
"""
from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf
from keras import layers


def euclidean_distance(vects):
    x, y = vects
    sum_square = tf.math.reduce_sum(tf.math.square(x - y), axis=1, keepdims=True)
    return tf.math.sqrt(tf.math.maximum(sum_square, keras.backend.epsilon()))


def contrastive_loss_of(margin=1):
    def contrastive_loss(y_true, y_pred):
        square_pred = tf.math.square(y_pred)
        margin_square = tf.math.square(tf.math.maximum(margin - (y_pred), 0))
        return tf.math.reduce_mean((1 - y_true) * square_pred + (y_true) * margin_square)
    return contrastive_loss


def siamese(seed: int = 3) -> keras.Model:
    keras.utils.set_random_seed(seed)
    inputs = layers.Input((28, 28, 1))
    x = layers.BatchNormalization()(inputs)
    x = layers.Conv2D(4, (5, 5), activation="tanh")(x)
    x = layers.AveragePooling2D(pool_size=(2, 2))(x)
    x = layers.Conv2D(16, (5, 5), activation="tanh")(x)
    x = layers.AveragePooling2D(pool_size=(2, 2))(x)
    x = layers.Flatten()(x)
    x = layers.BatchNormalization()(x)
    x = layers.Dense(10, activation="tanh")(x)
    embedding_network = keras.Model(inputs, x)
    input_1 = layers.Input((28, 28, 1))
    input_2 = layers.Input((28, 28, 1))
    tower_1 = embedding_network(input_1)
    tower_2 = embedding_network(input_2)
    merge_layer = layers.Lambda(euclidean_distance)([tower_1, tower_2])
    normal_layer = layers.BatchNormalization()(merge_layer)
    output_layer = layers.Dense(1, activation="sigmoid")(normal_layer)
    model = keras.Model(inputs=[input_1, input_2], outputs=output_layer)
    model.compile(loss=contrastive_loss_of(margin=1), optimizer="RMSprop",
                  metrics=["accuracy"])
    return model


def siamese_data(n: int = 64):
    """([x1, x2], labels): pairs of 28x28 images, labels (n,) float32, 1 for a pair of
    the same 'class' (a pattern plus noise), as keras.io's make_pairs gives them."""
    rng = np.random.default_rng(11)
    patterns = rng.normal(size=(4, 28, 28, 1)).astype("float32")
    first = rng.integers(0, 4, n)
    same = rng.integers(0, 2, n)
    second = np.where(same == 1, first, (first + 1 + rng.integers(0, 3, n)) % 4)
    noise = lambda: rng.normal(scale=0.5, size=(n, 28, 28, 1)).astype("float32")  # noqa: E731
    return (patterns[first] + noise(), patterns[second] + noise()), same.astype("float32")


def siamese_dataset(batch: int = 16):
    (x1, x2), y = siamese_data()
    return tf.data.Dataset.from_tensor_slices(((x1, x2), y)).batch(batch, drop_remainder=True)


def mnist_convnet(optimizer=None, seed: int = 3) -> keras.Model:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        keras.Input(shape=(28, 28, 1)),
        layers.Conv2D(32, kernel_size=(3, 3), activation="relu"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Conv2D(64, kernel_size=(3, 3), activation="relu"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Flatten(),
        layers.Dropout(0.5),
        layers.Dense(10, activation="softmax"),
    ])
    model.compile(loss="categorical_crossentropy", optimizer=optimizer or "adam",
                  metrics=["accuracy"])
    return model


def mnist_data(n: int = 64):
    rng = np.random.default_rng(9)
    x = rng.uniform(size=(n, 28, 28, 1)).astype("float32")
    return x, keras.utils.to_categorical(rng.integers(0, 10, n), 10).astype("float32")


def mnist_dataset(batch: int = 16):
    return tf.data.Dataset.from_tensor_slices(mnist_data()).batch(batch, drop_remainder=True)


LATENT = 4


class GAN(keras.Model):
    """keras.io's GAN: its own compile taking two optimizers (not built there), its own
    train_step applying each, its trackers."""

    def __init__(self, discriminator, generator, latent_dim):
        super().__init__()
        self.discriminator = discriminator
        self.generator = generator
        self.latent_dim = latent_dim
        self.seed_generator = keras.random.SeedGenerator(1337)

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer = d_optimizer
        self.g_optimizer = g_optimizer
        self.loss_fn = loss_fn
        self.d_loss_metric = keras.metrics.Mean(name="d_loss")
        self.g_loss_metric = keras.metrics.Mean(name="g_loss")

    @property
    def metrics(self):
        return [self.d_loss_metric, self.g_loss_metric]

    def train_step(self, real_images):
        batch_size = tf.shape(real_images)[0]
        random_latent_vectors = keras.random.normal(
            shape=(batch_size, self.latent_dim), seed=self.seed_generator)
        generated_images = self.generator(random_latent_vectors)
        combined_images = tf.concat([generated_images, real_images], axis=0)
        labels = tf.concat([tf.ones((batch_size, 1)), tf.zeros((batch_size, 1))], axis=0)
        labels += 0.05 * keras.random.uniform(tf.shape(labels), seed=self.seed_generator)
        with tf.GradientTape() as tape:
            predictions = self.discriminator(combined_images)
            d_loss = self.loss_fn(labels, predictions)
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))  # noqa: B905
        random_latent_vectors = keras.random.normal(
            shape=(batch_size, self.latent_dim), seed=self.seed_generator)
        misleading_labels = tf.zeros((batch_size, 1))
        with tf.GradientTape() as tape:
            predictions = self.discriminator(self.generator(random_latent_vectors))
            g_loss = self.loss_fn(misleading_labels, predictions)
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))  # noqa: B905
        self.d_loss_metric.update_state(d_loss)
        self.g_loss_metric.update_state(g_loss)
        return {"d_loss": self.d_loss_metric.result(),
                "g_loss": self.g_loss_metric.result()}


def gan(seed: int = 3) -> GAN:
    keras.utils.set_random_seed(seed)
    discriminator = keras.Sequential([keras.Input((8,)), layers.Dense(16),
                                      layers.LeakyReLU(negative_slope=0.2),
                                      layers.Dense(1)], name="discriminator")
    generator = keras.Sequential([keras.Input((LATENT,)), layers.Dense(16),
                                  layers.LeakyReLU(negative_slope=0.2), layers.Dense(8)],
                                 name="generator")
    model = GAN(discriminator=discriminator, generator=generator, latent_dim=LATENT)
    model.compile(d_optimizer=keras.optimizers.Adam(learning_rate=0.0003),
                  g_optimizer=keras.optimizers.Adam(learning_rate=0.0003),
                  loss_fn=keras.losses.BinaryCrossentropy(from_logits=True))
    return model


def gan_data(n: int = 64):
    rng = np.random.default_rng(5)
    return rng.normal(size=(n, 8)).astype("float32")


__all__ = ["mnist_convnet", "mnist_data", "mnist_dataset", "siamese", "siamese_data",
           "siamese_dataset", "contrastive_loss_of", "gan", "gan_data", "GAN", "LATENT"]
